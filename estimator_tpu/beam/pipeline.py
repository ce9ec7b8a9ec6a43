"""The Beam pipeline that turns labelled image files into TFRecord shards.

Pure functions (`encode_image`, `encode_example`, `make_manifest`) hold the
per-image and per-dataset logic; thin DoFns run them; `build_pipeline(p, plan)`
wires them up. Which file goes to which split and shard is decided before the
pipeline runs (preprocess_inputs.py) and travels with each InputItem
(preprocess_plan.py).

Records never cross a shuffle: each worker streams its records into part files
(one per bundle and shard), and a last step concatenates the parts of each
shard (TFRecord files concatenate byte-wise). So peak memory does not grow with
the number of images. Beam's WriteToTFRecord is not used: with a fixed shard
count it groups every record by shard first (the DirectRunner holds them all
in memory), and it needs a crc32c package the pinned stack does not have.
"""

import collections
import csv
import dataclasses
import functools
import io
import json
import uuid

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import window
import numpy as np
from PIL import Image
import tensorflow as tf

from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.data import layout
from estimator_tpu.data import schema

JPEG_QUALITY = 95

# Inputs travel in chunks: Beam's per-element overhead (about 0.2 ms here)
# is then paid per chunk rather than per image.
CHUNK_SIZE = 64
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
# Image.open tries formats in order; most inputs are JPEG or PNG.
_COMMON_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF")
_COPY_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class EncodedImage:
  """An RGB JPEG to store; `converted` when it is not the input's bytes."""
  jpeg_bytes: bytes
  height: int
  width: int
  converted: bool


@dataclasses.dataclass(frozen=True)
class EncodedExample:
  """A serialized tf.train.Example and the size of the image it holds."""
  serialized: bytes
  height: int
  width: int
  converted: bool


def _fit(size, max_size):
  """(width, height) scaled so the long side is max_size, at least 1x1."""
  width, height = size
  scale = max_size / max(width, height)
  return max(1, round(width * scale)), max(1, round(height * scale))


@functools.cache
def _formats():
  """Every format PIL reads, the common ones first (tried in this order)."""
  Image.init()
  return tuple(_COMMON_FORMATS) + tuple(
      f for f in Image.ID if f not in _COMMON_FORMATS)


def _open_and_load(image_bytes, max_size):
  """Decodes the whole image once; returns (image, needs_resize)."""
  try:
    image = Image.open(io.BytesIO(image_bytes), formats=_formats())
    needs_resize = bool(max_size) and max(image.size) > max_size
    if needs_resize:
      # JPEG only: decode at a reduced DCT scale, still reading every byte.
      image.draft(None, _fit(image.size, max_size))
    image.load()
  except Image.DecompressionBombError as e:
    raise plan_lib.RejectedInput(plan_lib.IMAGE_TOO_LARGE, str(e)) from e
  except Image.UnidentifiedImageError as e:
    raise plan_lib.RejectedInput(plan_lib.NOT_AN_IMAGE,
                                 "not a recognised image format") from e
  except Exception as e:  # PIL's decoders raise many types on bad data.
    raise plan_lib.RejectedInput(plan_lib.CORRUPT_IMAGE,
                                 f"truncated or corrupt: {e}") from e
  return image, needs_resize


def _to_rgb(image):
  """Converts any PIL mode to RGB; transparency becomes white."""
  if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
    pixels = np.asarray(image, dtype=np.float64)
    if image.mode.startswith("I;16") or pixels.max() > 255:
      pixels = pixels / 257.0
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "L")
  if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
    rgba = image.convert("RGBA")
    background = Image.new("RGB", rgba.size, (255, 255, 255))
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background
  return image.convert("RGB")


def _jpeg_bytes(image):
  buffer = io.BytesIO()
  image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
  return buffer.getvalue()


def encode_image(image_bytes, max_size=None):
  """Validates an image file's bytes and returns the RGB JPEG to store.

  The image is fully decoded once. An RGB JPEG (baseline or progressive) that
  needs no resizing is returned byte-for-byte; anything else PIL decodes (PNG,
  grayscale, CMYK, ...) is converted to an RGB JPEG of quality 95.

  Args:
    image_bytes: the file's contents.
    max_size: if set, the long side is downsized to this many pixels.

  Returns:
    An EncodedImage with the stored image's height and width.

  Raises:
    RejectedInput: the bytes are empty, not an image, truncated or corrupt.
  """
  if not image_bytes:
    raise plan_lib.RejectedInput(plan_lib.EMPTY_FILE, "zero-byte file")
  image, needs_resize = _open_and_load(image_bytes, max_size)
  if image.format == "JPEG" and image.mode == "RGB" and not needs_resize:
    return EncodedImage(image_bytes, image.height, image.width, False)
  try:
    image = _to_rgb(image)
    if needs_resize:
      image = image.resize(_fit(image.size, max_size), Image.BICUBIC)
  except Exception as e:  # e.g. a mode PIL cannot convert.
    raise plan_lib.RejectedInput(plan_lib.CORRUPT_IMAGE,
                                 f"cannot convert to RGB: {e}") from e
  return EncodedImage(_jpeg_bytes(image), image.height, image.width, True)


def encode_example(image_bytes, label, class_name, filename, max_size=None):
  """Validates one image and builds its serialized tf.train.Example.

  Args:
    image_bytes: the image file's contents.
    label: 0-based class index (stored 1-based by schema.make_example).
    class_name: the class name.
    filename: the source path, stored as image/filename.
    max_size: optional long-side limit in pixels.

  Returns:
    An EncodedExample.

  Raises:
    RejectedInput: see encode_image.
  """
  image = encode_image(image_bytes, max_size)
  example = schema.make_example(image.jpeg_bytes, label, class_name,
                                  image.height, image.width, filename)
  return EncodedExample(example.SerializeToString(), image.height, image.width,
                        image.converted)


def read_file(path):
  """Returns a file's bytes (local or any Beam filesystem, e.g. gs://).

  Raises:
    RejectedInput: the file is missing or unreadable.
  """
  try:
    with FileSystems.open(path, compression_type=_UNCOMPRESSED) as f:
      return f.read()
  except Exception as e:  # Each filesystem raises its own types.
    if not FileSystems.exists(path):
      raise plan_lib.RejectedInput(plan_lib.FILE_NOT_FOUND,
                                   "no such file") from e
    raise plan_lib.RejectedInput(plan_lib.READ_ERROR, str(e)) from e


class DatasetStats:
  """Counts and image-size statistics of what a bundle (or run) wrote.

  Each EncodeAndWriteFn bundle fills one, as a lifted combiner would; the last
  step merges them. (A CombineGlobally costs ~0.5 s of fixed DirectRunner
  stages, a tenth of a 10,000-image run on 2 cores.)
  """

  def __init__(self):
    self.counts = collections.Counter()  # (split, class_name) -> images
    self.rejected = collections.Counter()  # reason code -> inputs
    self.converted = 0
    self.height = [None, None, 0]  # min, max, sum
    self.width = [None, None, 0]

  def add_image(self, split, class_name, height, width, converted):
    self.counts[(split, class_name)] += 1
    self.converted += int(converted)
    self._merge_sizes((height, height, height), (width, width, width))

  def add_rejected(self, reason):
    """Counts one rejected input by the code that starts `reason`."""
    self.rejected[plan_lib.reason_code(reason)] += 1
    return self

  def _merge_sizes(self, height, width):
    for mine, theirs in ((self.height, height), (self.width, width)):
      if theirs[0] is not None:
        mine[0] = theirs[0] if mine[0] is None else min(mine[0], theirs[0])
        mine[1] = theirs[1] if mine[1] is None else max(mine[1], theirs[1])
        mine[2] += theirs[2]

  def merge(self, other):
    self.counts.update(other.counts)
    self.rejected.update(other.rejected)
    self.converted += other.converted
    self._merge_sizes(other.height, other.width)
    return self


def merge_stats(partials, early_rejects=()):
  """One DatasetStats from per-bundle ones and rows rejected before Beam."""
  merged = DatasetStats()
  for partial in partials:
    merged.merge(partial)
  for _, reason in early_rejects:
    merged.add_rejected(reason)
  return merged


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
    self._parts, self._stats = {}, DatasetStats()

  def setup(self):
    tf.io.gfile.makedirs(self._temp_dir)
    _formats()  # Loads PIL's format plugins once per worker, not per image.

  def start_bundle(self):
    self._parts, self._stats = {}, DatasetStats()

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
        encoded = encode_example(read_file(item.path), item.label,
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
    self._parts, self._stats = {}, DatasetStats()


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


def _size_stats(stat, count):
  low, high, total = stat
  return {"min": low or 0, "max": high or 0,
          "mean": round(total / count, 2) if count else 0}


def make_manifest(plan, stats, shard_infos):
  """The manifest.json contents (a JSON-able dict).

  Args:
    plan: the Plan that was run.
    stats: the DatasetStats of the run.
    shard_infos: ConcatShardFn's dicts, one per shard written.

  Returns:
    A dict; see docs/PREPROCESS.md for the schema.
  """
  splits = {}
  for split in layout.SPLITS:
    shards = sorted((s for s in shard_infos if s["split"] == split),
                    key=lambda s: s["shard"])
    per_class = {name: stats.counts[(split, name)] for name in plan.labels}
    splits[split] = {
        "count": sum(per_class.values()),
        "shards": [s["name"] for s in shards],
        "shard_counts": [s["count"] for s in shards],
        "shard_bytes": [s["bytes"] for s in shards],
        "bytes": sum(s["bytes"] for s in shards),
        "per_class": per_class,
    }
  count = sum(s["count"] for s in splits.values())
  rejected = sum(stats.rejected.values())
  return {
      "format_version": layout.MANIFEST_VERSION,
      "labels": list(plan.labels),
      "num_classes": len(plan.labels),
      "splits": splits,
      "rejected": {"count": rejected,
                   "by_reason": dict(sorted(stats.rejected.items())),
                   "file": layout.REJECTED_FILE},
      "images": {"count": count, "converted": stats.converted,
                 "height": _size_stats(stats.height, count),
                 "width": _size_stats(stats.width, count)},
      "inputs": count + rejected,
      "flags": dict(plan.settings),
  }


def rejected_csv(rows):
  """rejected.csv's text: a `path,reason` header, then rows sorted by path."""
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator="\n")
  writer.writerow(layout.REJECTED_HEADER)
  writer.writerows(sorted(rows))
  return buffer.getvalue()


def _write_text(path, text, mime_type):
  with FileSystems.create(path, mime_type=mime_type,
                          compression_type=_UNCOMPRESSED) as f:
    f.write(text.encode("utf-8"))


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
              rejected_csv(list(rejected) + list(plan.rejected)), "text/csv")
  stats = merge_stats(partial_stats, plan.rejected)
  manifest = make_manifest(plan, stats, shard_infos)
  _write_text(FileSystems.join(output_dir, layout.MANIFEST_FILE),
              json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
              "application/json")
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
