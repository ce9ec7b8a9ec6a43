"""The Beam pipeline that turns labelled image files into TFRecord shards.

The per-image work is encode.py's pure functions and the per-dataset counts
manifest.py's; thin DoFns here run them, and `build_pipeline(p, plan)` wires
them up. Which file goes to which split and shard is decided before the
pipeline runs (sources.py) and travels with each InputItem (plan.py).

Records never cross a shuffle: each worker streams its records into part files
(one per bundle and shard), and a last step concatenates the parts of each
shard (TFRecord files concatenate byte-wise). So peak memory does not grow with
the number of images. Beam's WriteToTFRecord is not used: with a fixed shard
count it groups every record by shard first (the DirectRunner holds them all
in memory), and it needs a crc32c package the pinned stack does not have.
"""

import dataclasses
import functools
import json
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import window
import tensorflow as tf

from estimator_tpu.beam import encode
from estimator_tpu.beam import manifest as manifest_lib
from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.data import layout

# Inputs travel in chunks: Beam's per-element overhead (about 0.2 ms here)
# is then paid per chunk rather than per image.
CHUNK_SIZE = 64
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
_COPY_CHUNK = 8 << 20


@functools.cache
def _windowed(value, tag=None):
  value = window.GlobalWindows.windowed_value(value)
  return beam.pvalue.TaggedOutput(tag, value) if tag else value


class EncodeAndWriteFn(beam.DoFn):
  """Chunks of InputItems -> records streamed into per-bundle part files.

  Outputs, at the end of each bundle: ((split, shard), (part_path, records))
  per part file on the main output and the bundle's DatasetStats on STATS;
  (path, reason) per rejected input on REJECTED as it happens. Images are
  never held beyond the one being encoded.
  """

  REJECTED = "rejected"
  STATS = "stats"

  def __init__(self, temp_dir, max_size=None):
    self._temp_dir = temp_dir
    self._max_size = max_size
    self._images = beam.metrics.Metrics.counter("preprocess", "images")
    self._rejects = beam.metrics.Metrics.counter("preprocess", "rejected")
    self._parts, self._stats = {}, manifest_lib.DatasetStats()

  def setup(self):
    tf.io.gfile.makedirs(self._temp_dir)
    encode.image_formats()  # Loads PIL's format plugins once per worker, not per image.

  def start_bundle(self):
    self._parts, self._stats = {}, manifest_lib.DatasetStats()

  def _part(self, item):
    """The open [path, writer, count] part for the item's split and shard."""
    key = (item.split, item.shard)
    if key not in self._parts:
      path = FileSystems.join(
          self._temp_dir, f"{item.split}-{item.shard:05d}-{uuid.uuid4().hex}")
      self._parts[key] = [path, tf.io.TFRecordWriter(path), 0]
    return self._parts[key]

  def process(self, chunk):
    for item in chunk:
      try:
        encoded = encode.encode_example(encode.read_file(item.path), item.label,
                                 item.class_name, item.path, self._max_size)
      except plan_lib.RejectedInput as e:
        self._rejects.inc()
        self._stats.add_rejected(str(e))
        yield beam.pvalue.TaggedOutput(self.REJECTED, (item.path, str(e)))
        continue
      part = self._part(item)
      part[1].write(encoded.serialized)
      part[2] += 1
      self._images.inc()
      self._stats.add_image(item.split, item.class_name, encoded.height,
                            encoded.width, encoded.converted)

  def finish_bundle(self):
    for key, (path, writer, count) in sorted(self._parts.items()):
      writer.close()
      yield _windowed((key, (path, count)))
    yield _windowed(self._stats, self.STATS)
    self._parts, self._stats = {}, manifest_lib.DatasetStats()


def _copy_into(out, path):
  """Appends a file's bytes to an open output file; returns how many."""
  copied = 0
  with FileSystems.open(path, compression_type=_UNCOMPRESSED) as f:
    while chunk := f.read(_COPY_CHUNK):
      out.write(chunk)
      copied += len(chunk)
  return copied


class ConcatShardFn(beam.DoFn):
  """(split, shard) -> writes the shard from its parts; emits its summary."""

  def __init__(self, output_dir, num_shards):
    self._output_dir = output_dir
    self._num_shards = num_shards

  def process(self, key, parts):
    split, shard = key
    name = layout.shard_name(split, shard, self._num_shards[split])
    num_bytes, num_records = 0, 0
    with FileSystems.create(FileSystems.join(self._output_dir, name),
                            mime_type="application/octet-stream",
                            compression_type=_UNCOMPRESSED) as out:
      for path, count in sorted(parts[key]):  # [] when it has no part.
        num_bytes += _copy_into(out, path)
        num_records += count
    yield {"split": split, "shard": shard, "name": name, "bytes": num_bytes,
           "count": num_records}


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


def finalize(unused_element, plan, temp_dir, partial_stats, shard_infos,
             rejected):
  """Writes labels.txt, rejected.csv, then manifest.json; removes temp_dir.

  Runs once, after every shard is written (its side inputs say so), so the
  manifest appears only when the dataset is complete.

  Args:
    unused_element: the None that triggers the step.
    plan: the Plan (its items may be left out).
    temp_dir: the part files' folder.
    partial_stats: DatasetStats, one per EncodeAndWriteFn bundle.
    shard_infos: ConcatShardFn's dicts.
    rejected: (path, reason) rows from EncodeAndWriteFn.

  Returns:
    The manifest dict.
  """
  output_dir = plan.output_dir
  _write_text(FileSystems.join(output_dir, layout.LABELS_FILE),
              layout.format_labels(plan.labels), "text/plain")
  _write_text(FileSystems.join(output_dir, layout.REJECTED_FILE),
              manifest_lib.rejected_csv(list(rejected) + list(plan.rejected)), "text/csv")
  stats = manifest_lib.merge_stats(partial_stats, plan.rejected)
  manifest = manifest_lib.make_manifest(plan, stats, shard_infos)
  _write_whole(FileSystems.join(output_dir, layout.MANIFEST_FILE),
               json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", "application/json")
  if FileSystems.exists(temp_dir):
    FileSystems.delete([temp_dir])
  return manifest


def write_items(path, items, size=CHUNK_SIZE):
  """Writes InputItems as JSON lines, `size` to a chunk.

  Returns:
    A (path, offset, length) reference to each chunk's bytes.
  """
  refs, offset = [], 0
  with FileSystems.create(path, mime_type="application/jsonl",
                          compression_type=_UNCOMPRESSED) as f:
    for start in range(0, len(items), size):
      data = b"".join(json.dumps(list(item), ensure_ascii=False).encode(
          "utf-8") + b"\n" for item in items[start:start + size])
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

  The inputs are written to a file in a temporary folder of the output
  directory now, and only references to chunks of it travel through Beam:
  carried in the graph they would cost ~50 us each to pickle and could exceed
  Dataflow's limit on a job's size, and the DirectRunner would hold them all
  in memory across the Reshuffle. The last step removes the folder.

  Args:
    p: a beam.Pipeline (or TestPipeline).
    plan: a Plan.

  Returns:
    A dict of PCollections for tests: `rejected` ((path, reason) pairs read
    and rejected by Beam), `stats` (DatasetStats, one per bundle), `shards`
    (one dict per shard written) and `manifest` (one dict, written last).
  """
  temp_dir = FileSystems.join(plan.output_dir,
                              plan_lib.TEMP_DIR_PREFIX + uuid.uuid4().hex)
  chunks = write_items(FileSystems.join(temp_dir, "inputs.jsonl"), plan.items)
  written = (
      p
      | "Chunks" >> beam.Create(chunks)
      | "Spread" >> beam.Reshuffle()
      | "Inputs" >> beam.Map(read_chunk)
      | "EncodeAndWrite" >> beam.ParDo(
          EncodeAndWriteFn(temp_dir, plan.max_size)).with_outputs(
              EncodeAndWriteFn.REJECTED, EncodeAndWriteFn.STATS, main="parts"))
  rejected = written[EncodeAndWriteFn.REJECTED]
  stats = written[EncodeAndWriteFn.STATS]
  shards = (
      p
      | "ShardKeys" >> beam.Create(_shard_keys(plan))
      | "SpreadShards" >> beam.Reshuffle()
      | "Concat" >> beam.ParDo(ConcatShardFn(plan.output_dir, plan.num_shards),
                               parts=beam.pvalue.AsMultiMap(written.parts)))
  summary = dataclasses.replace(plan, items=())  # Keeps the graph small.
  manifest = (
      p
      | "Once" >> beam.Create([None])
      | "Finalize" >> beam.Map(finalize, summary, temp_dir,
                               beam.pvalue.AsList(stats),
                               beam.pvalue.AsList(shards),
                               beam.pvalue.AsList(rejected)))
  return {"rejected": rejected, "stats": stats, "shards": shards,
          "manifest": manifest}
