"""Tests of beam_pipeline: pure encoders, and the pipeline in TestPipeline."""

import collections
import csv
import io
import json
import os

import apache_beam as beam
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that
from apache_beam.testing.util import equal_to
import conftest
import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from estimator_tpu.beam import encode
from estimator_tpu.beam import manifest as manifest_lib
from estimator_tpu.beam import pipeline as bp
from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.beam import sources
from estimator_tpu.data import digits
from estimator_tpu.data import layout
from estimator_tpu.data import schema


@pytest.fixture(scope="module")
def digit():
  images, _ = digits.digit_arrays(limit=1, size=32)
  return images[0]


def _decode(jpeg_bytes):
  return Image.open(io.BytesIO(jpeg_bytes))


def test_encode_example_round_trip_keeps_rgb_jpeg_bytes(digit):
  jpeg = digits.encode_jpeg(digit)
  encoded = encode.encode_example(jpeg, 3, "three", "/data/three/1.jpg")
  parsed = schema.parse_example(tf.constant(encoded.serialized))
  assert parsed["image_bytes"].numpy() == jpeg
  assert parsed["label"].numpy() == 3
  assert parsed["class_name"].numpy() == b"three"
  assert parsed["filename"].numpy() == b"/data/three/1.jpg"
  assert (encoded.height, encoded.width, encoded.converted) == (32, 32, False)
  example = tf.train.Example.FromString(encoded.serialized)
  assert example.features.feature[schema.LABEL].int64_list.value == [4]


def test_progressive_rgb_jpeg_is_stored_byte_for_byte(digit):
  jpeg = conftest.image_bytes(digit, progressive=True, quality=90)
  assert encode.encode_image(jpeg).jpeg_bytes == jpeg


@pytest.mark.parametrize("fmt,mode", [("PNG", "RGB"), ("JPEG", "L"),
                                      ("JPEG", "CMYK"), ("PNG", "RGBA"),
                                      ("PNG", "P"), ("BMP", "RGB")])
def test_other_images_become_rgb_jpeg(digit, fmt, mode):
  source = conftest.image_bytes(digit, fmt=fmt, mode=mode)
  image = encode.encode_image(source)
  decoded = _decode(image.jpeg_bytes)
  assert (decoded.format, decoded.mode, decoded.size) == ("JPEG", "RGB",
                                                          (32, 32))
  assert image.converted and (image.height, image.width) == (32, 32)
  # The same picture, up to JPEG quality 95 (and 4:2:0 chroma for colour).
  expected = np.asarray(_decode(source).convert("RGB"), np.float32)
  error = np.abs(np.asarray(decoded, np.float32) - expected)
  assert error.mean() < 3


def test_transparent_pixels_become_white():
  rgba = np.zeros((8, 8, 4), np.uint8)  # Fully transparent black.
  buffer = io.BytesIO()
  Image.fromarray(rgba, "RGBA").save(buffer, format="PNG")
  decoded = np.asarray(_decode(encode.encode_image(buffer.getvalue()).jpeg_bytes))
  assert decoded.min() > 245


def test_sixteen_bit_grayscale_png_is_scaled_not_clipped():
  gray = np.full((8, 8), 32768, np.uint16)  # Mid-gray in 16 bits.
  buffer = io.BytesIO()
  Image.fromarray(gray).save(buffer, format="PNG")
  decoded = np.asarray(_decode(encode.encode_image(buffer.getvalue()).jpeg_bytes))
  assert abs(decoded.mean() - 127.5) < 3


def test_max_size_downsizes_the_long_side():
  photo = np.random.default_rng(0).integers(0, 255, (60, 80, 3), np.uint8)
  jpeg = digits.encode_jpeg(photo)
  image = encode.encode_image(jpeg, max_size=40)
  assert (image.height, image.width) == (30, 40)
  assert _decode(image.jpeg_bytes).size == (40, 30)
  assert encode.encode_image(jpeg, max_size=80).jpeg_bytes == jpeg  # Fits.


@pytest.mark.parametrize("data,reason", [
    (b"", plan_lib.EMPTY_FILE),
    (b"hello, world", plan_lib.NOT_AN_IMAGE),
    (None, plan_lib.CORRUPT_IMAGE),  # A truncated JPEG, filled in below.
])
def test_bad_bytes_are_rejected_with_a_reason(digit, data, reason):
  if data is None:
    data = digits.encode_jpeg(digit)[:200]
  with pytest.raises(plan_lib.RejectedInput) as raised:
    encode.encode_example(data, 0, "zero", "x.jpg")
  assert raised.value.reason == reason
  assert str(raised.value).startswith(reason)


def test_read_file_names_a_missing_file(tmp_path):
  with pytest.raises(plan_lib.RejectedInput) as raised:
    encode.read_file(str(tmp_path / "missing.jpg"))
  assert raised.value.reason == plan_lib.FILE_NOT_FOUND


def test_rejected_csv_quotes_and_sorts():
  text = manifest_lib.rejected_csv([("b,c.jpg", "not_an_image: x"), ("a.jpg", "r")])
  assert list(csv.reader(io.StringIO(text))) == [
      ["path", "reason"], ["a.jpg", "r"], ["b,c.jpg", "not_an_image: x"]]


def test_dataset_stats_merge():
  a, b = manifest_lib.DatasetStats(), manifest_lib.DatasetStats()
  a.add_image("train", "cat", 10, 20, False)
  b.add_image("train", "cat", 30, 5, True)
  b.add_rejected("empty_file: zero-byte file")
  merged = manifest_lib.merge_stats([a, b, manifest_lib.DatasetStats()],
                          [("x.csv:3", "malformed_csv_row: ...")])
  assert merged.counts[("train", "cat")] == 2
  assert merged.height == [10, 30, 40] and merged.width == [5, 20, 25]
  assert merged.rejected == {"empty_file": 1, "malformed_csv_row": 1}
  assert merged.converted == 1


def _records(output_dir, split):
  """{filename: (label, class, image_bytes)} of a split's shards."""
  manifest = _manifest(output_dir)
  paths = [os.path.join(output_dir, n) for n in manifest["splits"][split][
      "shards"]]
  records = {}
  for serialized in tf.data.TFRecordDataset(paths):
    parsed = schema.parse_example(serialized)
    records[parsed["filename"].numpy().decode()] = (
        int(parsed["label"]), parsed["class_name"].numpy().decode(),
        parsed["image_bytes"].numpy())
  return records


def _manifest(output_dir):
  path = os.path.join(output_dir, layout.MANIFEST_FILE)
  with open(path, encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def folder_plan(image_folder, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("folder_run"))
  return sources.make_plan(out, input_dir=image_folder,
                                     validation_fraction=0.25, num_shards=2)


@pytest.fixture(scope="module")
def folder_run(folder_plan):
  with test_pipeline.TestPipeline() as p:
    outputs = bp.build_pipeline(p, folder_plan)
    # Beam reads and rejects these; README.txt is rejected while listing.
    assert_that(outputs["rejected"] | beam.MapTuple(
        lambda path, reason: reason.split(":")[0]),
                equal_to(["empty_file", "not_an_image", "corrupt_image"]))
  return folder_plan.output_dir


def _planned_counts(plan, image_folder):
  """{split: {class: images}} the plan sends to each split, bad files aside."""
  counts = {split: collections.Counter() for split in layout.SPLITS}
  for item in plan.items:
    if os.path.relpath(item.path, image_folder) not in \
        conftest.IMAGE_FOLDER_REJECTED:
      counts[item.split][item.class_name] += 1
  return counts


def test_pipeline_counts_labels_and_rejects(folder_run, folder_plan,
                                            image_folder):
  manifest = _manifest(folder_run)
  assert manifest["labels"] == conftest.IMAGE_FOLDER_CLASSES
  splits = manifest["splits"]
  per_class = {name: splits["train"]["per_class"][name]
               + splits["validation"]["per_class"][name]
               for name in manifest["labels"]}
  assert per_class == conftest.IMAGE_FOLDER_EXPECTED
  planned = _planned_counts(folder_plan, image_folder)
  for split in layout.SPLITS:
    assert splits[split]["per_class"] == dict(planned[split])
  assert splits["train"]["count"] + splits["validation"]["count"] == 27
  assert 3 <= splits["validation"]["count"] <= 12  # 27 * 0.25, give or take.
  assert splits["train"]["shards"] == ["train-00000-of-00002.tfrecord",
                                       "train-00001-of-00002.tfrecord"]
  assert sum(splits["train"]["shard_counts"]) == splits["train"]["count"]
  assert manifest["rejected"] == {
      "count": 4, "file": "rejected.csv",
      "by_reason": {"corrupt_image": 1, "empty_file": 1, "not_an_image": 1,
                    "not_in_class_folder": 1}}
  assert manifest["images"]["converted"] == 3  # gray, cmyk, png_named.
  assert manifest["images"]["height"] == {"min": 32, "max": 32, "mean": 32.0}
  assert manifest["inputs"] == 31
  path = os.path.join(folder_run, layout.REJECTED_FILE)
  with open(path, encoding="utf-8") as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["path", "reason"]
  assert {os.path.relpath(p, image_folder): r.split(":")[0]
          for p, r in rows[1:]} == conftest.IMAGE_FOLDER_REJECTED
  path = os.path.join(folder_run, layout.LABELS_FILE)
  with open(path, encoding="utf-8") as f:
    assert f.read() == "cat\ndog\nñandú\n"
  assert not [n for n in os.listdir(folder_run) if n.startswith(".")]


def test_shards_hold_the_records(folder_run, image_folder):
  manifest = _manifest(folder_run)
  train = _records(folder_run, "train")
  validation = _records(folder_run, "validation")
  assert len(train) == manifest["splits"]["train"]["count"]
  assert len(validation) == manifest["splits"]["validation"]["count"]
  assert not set(train) & set(validation)
  for path, (label, name, image) in {**train, **validation}.items():
    assert conftest.IMAGE_FOLDER_CLASSES[label] == name
    assert os.path.relpath(path, image_folder).split("/")[0] == name
    assert tf.io.decode_jpeg(image).shape[-1] == 3
  original = os.path.join(image_folder, "ñandú", "pájaro 3.jpg")
  with open(original, "rb") as f:
    stored = {**train, **validation}[original][2]
    assert stored == f.read()  # Non-ASCII name; RGB JPEG kept as is.


def test_every_class_is_in_both_splits(folder_run):
  splits = _manifest(folder_run)["splits"]
  for split in layout.SPLITS:
    assert all(n > 0 for n in splits[split]["per_class"].values())


def _write_csv(path, rows):
  with open(path, "w", encoding="utf-8", newline="") as f:
    csv.writer(f).writerows(rows)


def test_csv_and_folder_inputs_give_identical_records(
    folder_run, image_folder, tmp_path):
  rows = [["path", "label"]]
  for name in conftest.IMAGE_FOLDER_CLASSES:
    for file_name in sorted(os.listdir(os.path.join(image_folder, name))):
      if not file_name.startswith("."):
        rows.append([os.path.join(image_folder, name, file_name), name])
  # Rows rejected before the split is drawn, so the splits stay the same.
  rows += [[os.path.join(image_folder, "cat", "00.jpg"), "cat"],
           [os.path.join(image_folder, "README.txt"), "horse"],
           ["only-one-field"]]
  _write_csv(tmp_path / "files.csv", rows)
  labels = tmp_path / "labels.txt"
  labels.write_text("cat\ndog\nñandú\n", encoding="utf-8")
  out = str(tmp_path / "out")
  plan = sources.make_plan(
      out, input_csv=str(tmp_path / "files.csv"), labels_file=str(labels),
      validation_fraction=0.25, num_shards=2)
  with test_pipeline.TestPipeline() as p:
    bp.build_pipeline(p, plan)
  for split in layout.SPLITS:
    assert _records(out, split) == _records(folder_run, split)
  assert _manifest(out)["rejected"]["by_reason"] == {
      "corrupt_image": 1, "duplicate_path": 1, "empty_file": 1,
      "malformed_csv_row": 1, "not_an_image": 1, "unknown_label": 1}


def test_csv_rows_of_missing_files_are_rejected(image_folder, tmp_path):
  good = os.path.join(image_folder, "dog", "01.jpg")
  _write_csv(tmp_path / "files.csv", [["dog/01.jpg", "dog"],
                                       ["gone.jpg", "dog"]])
  os.makedirs(tmp_path / "dog")
  with open(good, "rb") as src, open(tmp_path / "dog" / "01.jpg", "wb") as dst:
    dst.write(src.read())  # Relative paths are relative to the CSV.
  plan = sources.make_plan(str(tmp_path / "out"),
                                     input_csv=str(tmp_path / "files.csv"))
  with test_pipeline.TestPipeline() as p:
    outputs = bp.build_pipeline(p, plan)
    assert_that(outputs["rejected"], equal_to([
        (str(tmp_path / "gone.jpg"), "file_not_found: no such file")]))
  manifest = _manifest(str(tmp_path / "out"))
  assert manifest["splits"]["train"]["count"] == 1
  assert manifest["labels"] == ["dog"]


def test_the_same_inputs_give_the_same_shards(folder_run, image_folder,
                                              tmp_path):
  plan = sources.make_plan(str(tmp_path), input_dir=image_folder,
                                     validation_fraction=0.25, num_shards=2)
  with test_pipeline.TestPipeline() as p:
    bp.build_pipeline(p, plan)
  for split in layout.SPLITS:
    for name in _manifest(folder_run)["splits"][split]["shards"]:
      again = {r.numpy() for r in tf.data.TFRecordDataset(
          str(tmp_path / name))}
      first = {r.numpy() for r in tf.data.TFRecordDataset(
          os.path.join(folder_run, name))}
      assert again == first and first


def test_build_pipeline_exposes_stats_to_assert_that(image_folder, tmp_path):
  plan = sources.make_plan(str(tmp_path), input_dir=image_folder,
                                     validation_fraction=0.0)
  with test_pipeline.TestPipeline() as p:
    outputs = bp.build_pipeline(p, plan)
    assert_that(outputs["stats"]
                | beam.combiners.ToList()
                | beam.Map(lambda partials: manifest_lib.merge_stats(partials))
                | beam.Map(lambda s: (sum(s.counts.values()), s.height[:2],
                                      s.converted)),
                equal_to([(27, [32, 32], 3)]), label="Stats")
    assert_that(outputs["shards"] | beam.Map(lambda s: (s["name"],
                                                        s["count"])),
                equal_to([("train-00000-of-00001.tfrecord", 27)]),
                label="Shards")
  manifest = _manifest(str(tmp_path))
  assert manifest["splits"]["validation"] == {
      "count": 0, "shards": [], "shard_counts": [], "shard_bytes": [],
      "bytes": 0, "per_class": {"cat": 0, "dog": 0, "ñandú": 0}}
