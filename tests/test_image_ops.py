"""preprocessing: eager and inside Dataset.map agree; shapes, ranges and determinism."""

import io

import numpy as np
from PIL import Image
import tensorflow as tf

from estimator_tpu.data import digits
from estimator_tpu.data import image_ops


def _jpeg(size=(40, 30), gray=False):
  rng = np.random.default_rng(0)
  array = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
  image = Image.fromarray(array, "RGB")
  if gray:
    image = image.convert("L")
  buffer = io.BytesIO()
  image.save(buffer, format="JPEG")
  return buffer.getvalue()


def _png(size=(20, 20)):
  buffer = io.BytesIO()
  Image.new("RGB", size, (255, 0, 0)).save(buffer, format="PNG")
  return buffer.getvalue()


def test_eval_preprocessing_is_same_eagerly_and_in_dataset_map():
  data = _jpeg()
  eager = image_ops.preprocess_for_eval(tf.constant(data), 32).numpy()
  mapped = next(iter(tf.data.Dataset.from_tensors(data).map(
      lambda b: image_ops.preprocess_for_eval(b, 32)))).numpy()
  assert eager.shape == (32, 32, 3)
  assert eager.dtype == np.float32
  np.testing.assert_allclose(eager, mapped, atol=1e-5)


def test_eval_preprocessing_is_deterministic_and_normalized():
  data = tf.constant(digits.encode_jpeg(digits.digit_arrays(limit=1)[0][0]))
  first = image_ops.preprocess_for_eval(data, 32).numpy()
  second = image_ops.preprocess_for_eval(data, 32).numpy()
  np.testing.assert_array_equal(first, second)
  # White paper (255) normalizes to (255 - mean) / std, about +2.2 per channel.
  expected_white = (255 - np.array(image_ops.MEAN_RGB)) / np.array(image_ops.STDDEV_RGB)
  np.testing.assert_allclose(first[0, 0], expected_white, atol=0.1)


def test_grayscale_and_png_decode_to_three_channels():
  for data in (_jpeg(gray=True), _png()):
    image = image_ops.decode_image(tf.constant(data))
    assert image.shape[-1] == 3
    assert image_ops.preprocess_for_eval(tf.constant(data), 16).shape == (16, 16, 3)
  red = image_ops.decode_image(tf.constant(_png())).numpy()
  assert tuple(red[0, 0]) == (255, 0, 0)


def test_train_preprocessing_has_static_shape_and_varies():
  data = tf.constant(_jpeg((64, 48)))
  outputs = [image_ops.preprocess_for_train(data, 24).numpy() for _ in range(4)]
  assert all(o.shape == (24, 24, 3) for o in outputs)
  assert not all(np.array_equal(outputs[0], o) for o in outputs[1:])
  mapped = tf.data.Dataset.from_tensors(data).map(
      lambda b: image_ops.preprocess_for_train(b, 24))
  assert mapped.element_spec.shape == (24, 24, 3)


def test_train_preprocessing_stays_in_normalized_pixel_range():
  image = image_ops.preprocess_for_train(tf.constant(_jpeg()), 32).numpy()
  low = (0 - np.array(image_ops.MEAN_RGB)) / np.array(image_ops.STDDEV_RGB)
  high = (255 - np.array(image_ops.MEAN_RGB)) / np.array(image_ops.STDDEV_RGB)
  assert np.all(image >= low - 1e-4) and np.all(image <= high + 1e-4)
