"""Tests of features: the tf.Example schema (labels 1-based on disk)."""

import pytest
import tensorflow as tf

from estimator_tpu.data import digits
from estimator_tpu.data import schema as features


@pytest.fixture(scope="module")
def jpeg():
  images, _ = digits.digit_arrays(limit=1, size=16)
  return digits.encode_jpeg(images[0])


def test_make_example_writes_every_key_with_label_plus_one(jpeg):
  example = features.make_example(jpeg, 0, "zéro", 16, 16, "a/b.jpg")
  feature = example.features.feature
  assert feature[features.LABEL].int64_list.value == [1]
  assert feature[features.ENCODED].bytes_list.value == [jpeg]
  assert feature[features.CLASS_TEXT].bytes_list.value == ["zéro".encode()]
  assert feature[features.CLASS_SYNSET].bytes_list.value == ["zéro".encode()]
  assert feature[features.FORMAT].bytes_list.value == [b"jpeg"]
  assert feature[features.COLORSPACE].bytes_list.value == [b"RGB"]
  assert [feature[k].int64_list.value[0] for k in (
      features.HEIGHT, features.WIDTH, features.CHANNELS)] == [16, 16, 3]


def test_negative_labels_are_refused(jpeg):
  with pytest.raises(ValueError, match="got -1"):
    features.make_example(jpeg, -1, "x", 1, 1, "x.jpg")


def test_parse_example_round_trip_eagerly_and_in_dataset_map(jpeg):
  serialized = features.make_example(jpeg, 7, "seven", 16, 16,
                                     "f.jpg").SerializeToString()
  eager = features.parse_example(tf.constant(serialized))
  mapped = next(iter(tf.data.Dataset.from_tensors(serialized).map(
      features.parse_example)))
  for parsed in (eager, mapped):
    assert parsed["label"].dtype == tf.int32 and int(parsed["label"]) == 7
    assert parsed["image_bytes"].numpy() == jpeg
    assert parsed["class_name"].numpy() == b"seven"
    assert parsed["filename"].numpy() == b"f.jpg"
    assert tf.io.decode_jpeg(parsed["image_bytes"]).shape == (16, 16, 3)


def test_optional_keys_default_when_missing():
  # tensorflow/tpu's writer omits some keys; only image and label are needed.
  example = tf.train.Example(features=tf.train.Features(feature={
      features.ENCODED: tf.train.Feature(
          bytes_list=tf.train.BytesList(value=[b"x"])),
      features.LABEL: tf.train.Feature(
          int64_list=tf.train.Int64List(value=[3]))}))
  parsed = features.parse_example(tf.constant(example.SerializeToString()))
  assert int(parsed["label"]) == 2 and parsed["class_name"].numpy() == b""
