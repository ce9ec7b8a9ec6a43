"""The record schema and the feature keys: tf.Example keys, make_example(), parse_example().

Compatible with tensorflow/tpu's imagenet/flowers readers: labels are stored 1-based
on disk and every reader here subtracts 1.
"""

import tensorflow as tf

ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"
CLASS_TEXT = "image/class/text"
CLASS_SYNSET = "image/class/synset"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
COLORSPACE = "image/colorspace"
FILENAME = "image/filename"

IMAGE_FORMAT = b"jpeg"
COLORSPACE_RGB = b"RGB"
# Labels on disk are 1-based (tensorflow/tpu convention); 0 is never written.
LABEL_OFFSET = 1

# The features dict a model_fn gets: `image` always; `weight` in evaluation
# (0 for the padding that keeps shapes static).
IMAGE_KEY = "image"
WEIGHT_KEY = "weight"
# Training with augmentation on the accelerator: each image's flip, brightness
# and contrast draws, float32 [batch, 3], applied and removed before the
# model_fn sees the features (model/device_augmentation.py).
AUGMENTATION_KEY = "augmentation"


def _bytes(value):
  if isinstance(value, str):
    value = value.encode("utf-8")
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64(value):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))


def make_example(image_bytes, label, class_name, height, width, filename):
  """Builds the tf.train.Example for one RGB JPEG.

  Args:
    image_bytes: the JPEG file's bytes.
    label: 0-based class index; written 1-based.
    class_name: the class name (str), stored as text and synset.
    height: image height in pixels.
    width: image width in pixels.
    filename: the source path or name (str).

  Returns:
    A tf.train.Example.
  """
  if label < 0:
    raise ValueError(f"label must be a 0-based class index >= 0, got {label}")
  return tf.train.Example(features=tf.train.Features(feature={
      ENCODED: _bytes(image_bytes),
      FORMAT: _bytes(IMAGE_FORMAT),
      LABEL: _int64(label + LABEL_OFFSET),
      CLASS_TEXT: _bytes(class_name),
      CLASS_SYNSET: _bytes(class_name),
      HEIGHT: _int64(height),
      WIDTH: _int64(width),
      CHANNELS: _int64(3),
      COLORSPACE: _bytes(COLORSPACE_RGB),
      FILENAME: _bytes(filename),
  }))


# Only the keys a reader needs are required; tensorflow/tpu's writer omits some
# of the others, so they default rather than fail.
_PARSE_SPEC = {
    ENCODED: tf.io.FixedLenFeature([], tf.string),
    LABEL: tf.io.FixedLenFeature([], tf.int64),
    CLASS_TEXT: tf.io.FixedLenFeature([], tf.string, default_value=""),
    FILENAME: tf.io.FixedLenFeature([], tf.string, default_value=""),
}


def parse_example(serialized):
  """Parses one serialized record (a scalar string tensor).

  Returns:
    A dict with `image_bytes` (scalar string), `label` (scalar int32, 0-based),
    `class_name` and `filename` (scalar strings).
  """
  parsed = tf.io.parse_single_example(serialized, _PARSE_SPEC)
  return {
      "image_bytes": parsed[ENCODED],
      "label": tf.cast(parsed[LABEL], tf.int32) - LABEL_OFFSET,
      "class_name": parsed[CLASS_TEXT],
      "filename": parsed[FILENAME],
  }
