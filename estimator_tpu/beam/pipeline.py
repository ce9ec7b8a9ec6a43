"""The Beam pipeline that turns labelled image files into TFRecord shards.

The per-image work is encode.py's pure functions and the per-dataset counts
manifest.py's; thin DoFns here run them, and `build_pipeline(p, plan)` wires
them up. Which file goes to which split and shard is decided before the
pipeline runs (sources.py) and travels with each InputItem (plan.py).

Records never cross a shuffle: each chunk of inputs (all of one shard) is
streamed into its own part file, and one step per shard concatenates its
parts (TFRecord files concatenate byte-wise). So peak memory does not grow
with the number of images. Beam's WriteToTFRecord is not used: with a fixed
shard count it groups every record by shard first (the DirectRunner holds them
all in memory), and it needs a crc32c package the pinned stack does not have.

The graph uses only what every runner carries, so that each gives the same
dataset: one main output per element, emitted from process(), and keyed
groups where a step needs all of an earlier step's results. Beam's DaskRunner
(2.77) drops what finish_bundle emits, hands every tagged output to every
consumer, computes only the branch that ends in the last transform and reads
side inputs by running their graph again inside a task.
"""

import dataclasses
import json
import typing
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
import tensorflow as tf

from estimator_tpu.beam import encode
from estimator_tpu.beam import manifest as manifest_lib
from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.beam import tally
from estimator_tpu.data import layout

# Inputs travel in chunks: Beam's per-element overhead (about 0.2 ms here)
# is then paid per chunk rather than per image.
CHUNK_SIZE = 64
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
_COPY_CHUNK = 8 << 20


class ChunkResult(typing.NamedTuple):
  """What EncodeChunkFn made of one chunk.

  Attributes:
    path: the part file of its records; None when none was valid.
    count: records in the part file.
    stats: the chunk's DatasetStats.
    rejected: (path, reason) per input of the chunk that was rejected.
  """
  path: typing.Optional[str]
  count: int
  stats: manifest_lib.DatasetStats
  rejected: tuple


class ShardResult(typing.NamedTuple):
  """What ConcatShardFn wrote: the shard's summary dict, its chunks' stats and rejects."""
  info: dict
  stats: manifest_lib.DatasetStats
  rejected: tuple


class EncodeChunkFn(beam.DoFn):
  """A chunk reference -> ((split, shard), ChunkResult), its records in one part file.

  All items of a chunk go to the same shard (write_items makes them so), so a
  chunk writes at most one part file. Images are never held beyond the one
  being encoded.
  """

  def __init__(self, temp_dir, max_size=None):
    self._temp_dir = temp_dir
    self._max_size = max_size
    self._images = beam.metrics.Metrics.counter("preprocess", "images")
    self._rejects = beam.metrics.Metrics.counter("preprocess", "rejected")

  def setup(self):
    tf.io.gfile.makedirs(self._temp_dir)
    encode.image_formats()  # Loads PIL's format plugins once per worker, not per image.

  def _encoded(self, items, stats, rejected):
    """Yields each valid item's encoded record; counts and keeps the rest."""
    for item in items:
      try:
        encoded = encode.encode_example(encode.read_file(item.path), item.label,
                                        item.class_name, item.path, self._max_size)
      except plan_lib.RejectedInput as e:
        self._rejects.inc()
        tally.add(rejected=1)
        stats.add_rejected(str(e))
        rejected.append((item.path, str(e)))
        continue
      self._images.inc()
      tally.add(encoded=1)
      stats.add_image(item.split, item.class_name, encoded.height,
                      encoded.width, encoded.converted)
      yield encoded.serialized

  def process(self, ref):
    items = read_chunk(ref)
    key = (items[0].split, items[0].shard)
    stats, rejected = manifest_lib.DatasetStats(), []
    path, writer, count = None, None, 0
    try:
      for serialized in self._encoded(items, stats, rejected):
        if writer is None:
          path = FileSystems.join(
              self._temp_dir, f"{key[0]}-{key[1]:05d}-{uuid.uuid4().hex}")
          writer = tf.io.TFRecordWriter(path)
        writer.write(serialized)
        count += 1
    finally:
      if writer is not None:
        writer.close()
    yield key, ChunkResult(path, count, stats, tuple(rejected))


def _copy_into(out, path):
  """Appends a file's bytes to an open output file; returns how many."""
  copied = 0
  with FileSystems.open(path, compression_type=_UNCOMPRESSED) as f:
    while chunk := f.read(_COPY_CHUNK):
      out.write(chunk)
      copied += len(chunk)
  return copied


class ConcatShardFn(beam.DoFn):
  """((split, shard), [ChunkResult or None]) -> writes the shard; emits (None, ShardResult).

  The None in each group (one per shard) makes a shard with no valid image
  an empty file rather than a missing one. The part files are concatenated in
  path order, so a shard's bytes do not depend on the order the group arrives in.
  """

  def __init__(self, output_dir, num_shards):
    self._output_dir = output_dir
    self._num_shards = num_shards

  def process(self, element):
    (split, shard), results = element
    results = [r for r in results if r is not None]
    name = layout.shard_name(split, shard, self._num_shards[split])
    num_bytes, num_records = 0, 0
    with FileSystems.create(FileSystems.join(self._output_dir, name),
                            mime_type="application/octet-stream",
                            compression_type=_UNCOMPRESSED) as out:
      for result in sorted((r for r in results if r.path), key=lambda r: r.path):
        num_bytes += _copy_into(out, result.path)
        num_records += result.count
    info = {"split": split, "shard": shard, "name": name, "bytes": num_bytes,
            "count": num_records}
    stats = manifest_lib.merge_stats(r.stats for r in results)
    rejected = tuple(row for r in results for row in r.rejected)
    yield None, ShardResult(info, stats, rejected)


def _write_text(path, text, mime_type):
  with FileSystems.create(path, mime_type=mime_type,
                          compression_type=_UNCOMPRESSED) as f:
    f.write(text.encode("utf-8"))


def _write_whole(path, text, mime_type):
  """Writes path under a temporary name first: a half-written manifest never exists."""
  temp = f"{path}.tmp-{uuid.uuid4().hex}"
  try:
    _write_text(temp, text, mime_type)
    FileSystems.rename([temp], [path])
  except BaseException:
    if FileSystems.exists(temp):
      FileSystems.delete([temp])
    raise


def finalize(element, plan, temp_dir):
  """Writes labels.txt, rejected.csv, then manifest.json; removes temp_dir.

  Runs once, on the group of every shard's result (and one None, so that it
  runs when there is no shard), so the manifest appears only when the dataset
  is complete.

  Args:
    element: (None, [ShardResult or None]), from the last GroupByKey.
    plan: the Plan (its items may be left out).
    temp_dir: the part files' folder.

  Returns:
    The manifest dict.
  """
  results = [r for r in element[1] if r is not None]
  output_dir = plan.output_dir
  _write_text(FileSystems.join(output_dir, layout.LABELS_FILE),
              layout.format_labels(plan.labels), "text/plain")
  rejected = [row for r in results for row in r.rejected] + list(plan.rejected)
  _write_text(FileSystems.join(output_dir, layout.REJECTED_FILE),
              manifest_lib.rejected_csv(rejected), "text/csv")
  stats = manifest_lib.merge_stats((r.stats for r in results), plan.rejected)
  manifest = manifest_lib.make_manifest(plan, stats, [r.info for r in results])
  _write_whole(FileSystems.join(output_dir, layout.MANIFEST_FILE),
               json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", "application/json")
  if FileSystems.exists(temp_dir):
    FileSystems.delete([temp_dir])
  return manifest


def _chunks(items, size):
  """items in lists of at most `size`, each list of one (split, shard)."""
  by_shard = {}
  for item in items:
    by_shard.setdefault((item.split, item.shard), []).append(item)
  for key in sorted(by_shard):
    shard_items = by_shard[key]
    for start in range(0, len(shard_items), size):
      yield shard_items[start:start + size]


def write_items(path, items, size=CHUNK_SIZE):
  """Writes InputItems as JSON lines, in chunks of at most `size` of one shard each.

  Returns:
    A (path, offset, length) reference to each chunk's bytes.
  """
  refs, offset = [], 0
  with FileSystems.create(path, mime_type="application/jsonl",
                          compression_type=_UNCOMPRESSED) as f:
    for chunk in _chunks(items, size):
      data = b"".join(json.dumps(list(item), ensure_ascii=False).encode(
          "utf-8") + b"\n" for item in chunk)
      f.write(data)
      refs.append((path, offset, len(data)))
      offset += len(data)
  return refs


def read_chunk(ref):
  """The tuple of InputItems that a write_items reference points to."""
  path, offset, length = ref
  with FileSystems.open(path, compression_type=_UNCOMPRESSED) as f:
    f.seek(offset)
    data = f.read(length)
  return tuple(plan_lib.InputItem(*json.loads(line))
               for line in data.splitlines())


def _shard_keys(plan):
  return [(split, shard) for split in layout.SPLITS
          for shard in range(plan.num_shards.get(split, 0))]


def build_pipeline(p, plan):
  """Adds the preprocessing transforms for `plan` to pipeline `p`.

  The inputs (and plan.command) are written to a temporary folder of the output
  directory now, and only references to chunks of it travel through Beam:
  carried in the graph they would cost ~50 us each to pickle and could exceed
  Dataflow's limit on a job's size, and the DirectRunner would hold them all
  in memory across the Reshuffle. The last step removes the folder.

  One chain: chunks -> part files -> grouped by shard -> shards -> grouped
  into one -> labels.txt, rejected.csv, manifest.json. The branches returned
  for tests are added before the last step, which stays the pipeline's last
  transform (the one the DaskRunner computes).

  Args:
    p: a beam.Pipeline (or TestPipeline).
    plan: a Plan.

  Returns:
    A dict of PCollections for tests: `rejected` ((path, reason) pairs read
    and rejected by Beam), `stats` (DatasetStats, one per chunk), `shards`
    (one dict per shard written) and `manifest` (one dict, written last).
  """
  temp_dir = FileSystems.join(plan.output_dir,
                              layout.TEMP_DIR_PREFIX + uuid.uuid4().hex)
  if plan.command:
    _write_text(FileSystems.join(temp_dir, layout.COMMAND_FILE), plan.command + "\n", "text/plain")
  chunks = write_items(FileSystems.join(temp_dir, "inputs.jsonl"), plan.items)
  written = (
      p
      | "Chunks" >> beam.Create(chunks)
      | "Spread" >> beam.Reshuffle()
      | "EncodeAndWrite" >> beam.ParDo(EncodeChunkFn(temp_dir, plan.max_size)))
  every_shard = (p
                 | "ShardKeys" >> beam.Create(_shard_keys(plan))
                 | "NoChunk" >> beam.Map(lambda key: (key, None)))
  shards = (
      (written, every_shard)
      | "WithEveryShard" >> beam.Flatten()
      | "ByShard" >> beam.GroupByKey()
      | "Concat" >> beam.ParDo(ConcatShardFn(plan.output_dir, plan.num_shards)))
  outputs = {
      "rejected": written | "Rejected" >> beam.FlatMap(lambda kv: kv[1].rejected),
      "stats": written | "Stats" >> beam.Map(lambda kv: kv[1].stats),
      "shards": shards | "ShardInfo" >> beam.Map(lambda kv: kv[1].info),
  }
  summary = dataclasses.replace(plan, items=())  # Keeps the graph small.
  outputs["manifest"] = (
      (shards, p | "Once" >> beam.Create([(None, None)]))
      | "WithOnce" >> beam.Flatten()
      | "All" >> beam.GroupByKey()
      | "Finalize" >> beam.Map(finalize, summary, temp_dir))
  return outputs
