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


# --- training crops: fused JPEG decode-and-crop, the fallback, and the old sampling --------------

PHOTO_HEIGHT, PHOTO_WIDTH = 150, 200


def _photo_array(seed=0, grain=10.0):
  """A photo-like uint8 [150, 200, 3]: per-channel gradients plus grain."""
  rng = np.random.default_rng(seed)
  y, x = np.mgrid[0:PHOTO_HEIGHT, 0:PHOTO_WIDTH]
  base = np.stack([60 + 0.5 * x, 200 - 0.6 * y, 90 + 0.3 * (x + y)], axis=-1)
  return np.clip(base + rng.normal(0, grain, base.shape), 0, 255).astype(np.uint8)


def _encoded(array, fmt):
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
  return buffer.getvalue()


def _old_crop_shapes(image, seed, count):
  """Crop sizes as augment_for_train sampled them before fused decoding (its arguments)."""
  def crop(decoded):
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(decoded), bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.5, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True, seed=seed)
    return tf.shape(tf.slice(decoded, begin, size))[:2]
  dataset = tf.data.Dataset.from_tensors(image).repeat(count).map(crop)
  return np.array([s.numpy() for s in dataset])


def _new_crop_shapes(image_bytes, seed, count):
  dataset = tf.data.Dataset.from_tensors(image_bytes).repeat(count).map(
      lambda b: tf.shape(image_ops.decode_random_crop(b, seed))[:2])
  return np.array([s.numpy() for s in dataset])


def _ks_statistic(a, b):
  """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
  points = np.sort(np.concatenate([a, b]))
  cdf_a = np.searchsorted(np.sort(a), points, side="right") / len(a)
  cdf_b = np.searchsorted(np.sort(b), points, side="right") / len(b)
  return np.abs(cdf_a - cdf_b).max()


def _area_and_aspect(shapes):
  heights, widths = shapes[:, 0].astype(float), shapes[:, 1].astype(float)
  return heights * widths / (PHOTO_HEIGHT * PHOTO_WIDTH), widths / heights


def test_jpeg_and_fallback_crops_match_the_old_crop_distribution():
  array, count = _photo_array(), 300
  old = _area_and_aspect(_old_crop_shapes(tf.constant(array), seed=11, count=count))
  fused = _area_and_aspect(_new_crop_shapes(tf.constant(_encoded(array, "JPEG")), 12, count))
  fallback = _area_and_aspect(_new_crop_shapes(tf.constant(_encoded(array, "PNG")), 13, count))
  # 300 vs 300 samples of one distribution: KS > 0.16 has probability < 0.1%.
  for new in (fused, fallback):
    for new_values, old_values in zip(new, old):
      assert _ks_statistic(new_values, old_values) < 0.16
  area, aspect = fused
  # Whole pixels: an area 2% under 0.5 and aspect ratios ~2% outside 3/4..4/3 can round in.
  assert area.min() >= 0.49 and area.max() <= 1.0 and area.std() > 0.1
  assert aspect.min() >= 0.73 and aspect.max() <= 1.36
  np.testing.assert_allclose(np.quantile(area, [0.25, 0.5, 0.75]),
                             np.quantile(old[0], [0.25, 0.5, 0.75]), atol=0.06)


def test_jpeg_and_fallback_take_the_same_windows_for_the_same_seed():
  array = _photo_array()
  jpeg = _new_crop_shapes(tf.constant(_encoded(array, "JPEG")), 5, 50)
  png = _new_crop_shapes(tf.constant(_encoded(array, "PNG")), 5, 50)
  np.testing.assert_array_equal(jpeg, png)
  assert len({tuple(s) for s in jpeg}) > 10


def test_decode_and_crop_has_the_pixels_of_a_full_decode_cropped():
  data = tf.constant(_encoded(_photo_array(), "JPEG"))
  full = image_ops.decode_image(data)
  for window in ([0, 0, PHOTO_HEIGHT, PHOTO_WIDTH], [16, 32, 96, 120], [33, 17, 101, 151]):
    window = tf.constant(window)
    fused = tf.image.decode_and_crop_jpeg(data, window, channels=3).numpy().astype(int)
    cropped = image_ops.crop_to_window(full, window).numpy().astype(int)
    assert fused.shape == cropped.shape == (window[2], window[3], 3)
    # Only chroma upsampling at a window edge not on the 16-pixel JPEG block grid
    # can differ by a few levels.
    assert np.abs(fused - cropped).mean() < 0.1
    assert np.abs(fused - cropped).max() <= 8


def test_resize_crop_keeps_uint8_and_matches_the_antialiased_resize_statistically():
  crop = tf.constant(_photo_array()[10:140, 20:190])  # 130 x 170 -> 64: a 2-2.7x shrink
  new = image_ops.resize_crop(crop, 64)
  assert new.dtype == tf.uint8 and new.shape == (64, 64, 3)
  old = tf.image.resize(crop, [64, 64], antialias=True).numpy()
  new = new.numpy().astype(float)
  # No antialiasing: same content and channel means, a little more of the grain.
  np.testing.assert_allclose(new.mean(axis=(0, 1)), old.mean(axis=(0, 1)), atol=0.5)
  assert np.abs(new - old).mean() < 4.0
  assert 0.97 < new.std() / old.std() < 1.05


def _reference_augment(image, flip, delta, factor):
  """The old per-image ops: flip, adjust_brightness, adjust_contrast, clip, normalize."""
  image = tf.image.flip_left_right(image) if flip else image
  image = tf.cast(image, tf.float32) / 255.0
  image = tf.image.adjust_contrast(tf.image.adjust_brightness(image, delta), factor)
  return image_ops.normalize(tf.clip_by_value(image, 0.0, 1.0) * 255.0).numpy()


def test_augment_batch_draws_flip_brightness_and_contrast_as_before():
  # Mid-grey ramps (no clipping): the flip shows in the ramp's direction, the
  # brightness delta in the mean and the contrast factor in the spread.
  ramp = np.tile(np.linspace(100, 150, 32, dtype=np.float32)[None, :, None], [16, 1, 3])
  images = tf.constant(np.repeat(ramp[None].astype(np.uint8), 1000, axis=0))
  out = image_ops.augment_batch(images, random_flip=True, seed=3).numpy()
  assert out.shape == (1000, 16, 32, 3) and out.dtype == np.float32
  pixels = out * np.array(image_ops.STDDEV_RGB) + np.array(image_ops.MEAN_RGB)
  source = images.numpy()[0].astype(float)
  flips = pixels[:, 0, 0, 0] > pixels[:, 0, -1, 0]
  deltas = (pixels.mean(axis=(1, 2, 3)) - source.mean()) / 255.0
  factors = pixels.std(axis=(1, 2, 3)) / source.std()
  assert 0.45 < flips.mean() < 0.55
  # 1000 draws against the uniform law tf.image.random_* draw from: KS > 0.07 has p < 0.1%.
  uniform = np.linspace(0, 1, 1000)
  assert _ks_statistic(deltas, (2 * uniform - 1) * image_ops.BRIGHTNESS_DELTA) < 0.07
  assert _ks_statistic(factors, 0.8 + 0.4 * uniform) < 0.07
  for i in range(0, 1000, 97):
    expected = _reference_augment(images[i], flips[i], deltas[i], factors[i])
    np.testing.assert_allclose(out[i], expected, atol=2e-3)


def test_augment_batch_without_flip_never_mirrors_and_varies_per_call():
  ramp = np.tile(np.arange(0, 256, 8, dtype=np.uint8)[None, :, None], [4, 1, 3])
  images = tf.constant(np.repeat(ramp[None], 64, axis=0))
  first = image_ops.augment_batch(images, random_flip=False).numpy()
  second = image_ops.augment_batch(images, random_flip=False).numpy()
  assert np.all(first[:, :, 0, 0] < first[:, :, -1, 0])
  assert not np.array_equal(first, second)


def test_train_preprocessing_of_png_and_jpeg_agree_in_a_dataset_map():
  array = _photo_array(grain=0.0)
  for fmt in ("JPEG", "PNG"):
    data = _encoded(array, fmt)
    eager = image_ops.preprocess_for_train(tf.constant(data), 48, random_flip=False)
    mapped = next(iter(tf.data.Dataset.from_tensors(data).map(
        lambda b: image_ops.preprocess_for_train(b, 48, random_flip=False))))
    for image in (eager.numpy(), mapped.numpy()):
      assert image.shape == (48, 48, 3)
      # Any crop of the red ramp (60..160) keeps red well inside the pixel range.
      red = image[..., 0] * image_ops.STDDEV_RGB[0] + image_ops.MEAN_RGB[0]
      assert 0.0 <= red.min() and red.max() <= 255.0 and red.std() > 5.0


# --- training decodes: merged chroma upsampling, reduced DCT scale ---------------------------


def test_dct_scale_needs_the_window_twice_the_target_on_both_sides():
  windows = [[0, 0, 63, 500], [5, 5, 64, 64], [0, 0, 127, 200], [0, 0, 128, 130],
             [3, 0, 300, 255], [0, 9, 256, 256], [0, 0, 4000, 3000]]
  expected = [1, 2, 2, 4, 4, 8, 8]
  eager = [int(image_ops.dct_scale(tf.constant(w), 32)) for w in windows]
  mapped = [int(s) for s in tf.data.Dataset.from_tensor_slices(windows).map(
      lambda w: image_ops.dct_scale(w, 32))]
  assert eager == mapped == expected


def test_a_scaled_window_is_the_same_region_of_the_scaled_decode():
  data = tf.constant(_encoded(_photo_array(), "JPEG"))
  for scale in (2, 4):
    # The scaled image is ceil(150 / scale) x ceil(200 / scale).
    whole = tf.io.decode_jpeg(data, channels=3, ratio=scale, fancy_upscaling=False).numpy()
    for window in ([0, 0, 150, 200], [17, 33, 101, 151], [1, 3, 146, 193]):
      top, left, height, width = image_ops.scale_window(tf.constant(window), scale).numpy()
      # The smallest scaled window covering the original one.
      assert top * scale <= window[0] < (top + 1) * scale
      assert left * scale <= window[1] < (left + 1) * scale
      assert (top + height) * scale >= window[0] + window[2] > (top + height - 1) * scale
      assert (left + width) * scale >= window[1] + window[3] > (left + width - 1) * scale
      crop = image_ops._decode_jpeg_window(data, tf.constant(window), scale).numpy()
      np.testing.assert_array_equal(crop, whole[top:top + height, left:left + width])


def _exact_and_training_decodes(data, window, image_size):
  """(exact decode+crop+resize, the training decode resized, antialiased exact) as float."""
  exact_crop = tf.image.decode_and_crop_jpeg(data, window, channels=3)
  exact = image_ops.resize_crop(exact_crop, image_size).numpy().astype(float)
  scale = image_ops.dct_scale(window, image_size)
  training = image_ops.resize_crop(image_ops._decode_jpeg_window(data, window, int(scale)),
                                   image_size).numpy().astype(float)
  smooth = tf.image.resize(exact_crop, [image_size, image_size], antialias=True).numpy()
  return exact, training, smooth, int(scale)


def test_training_decode_is_within_the_documented_tolerance_of_the_exact_decode():
  data = tf.constant(_encoded(_photo_array(grain=10.0), "JPEG"))
  windows = [[0, 0, 150, 200], [10, 20, 130, 150], [3, 41, 140, 131], [25, 7, 110, 160]]
  for image_size in (80, 32, 16):
    for window in windows:
      exact, training, smooth, scale = _exact_and_training_decodes(
          data, tf.constant(window), image_size)
      difference = np.abs(training - exact)
      if scale == 1:
        # Merged chroma upsampling only (image_ops.JPEG_FANCY_UPSCALING).
        assert image_size == 80
        assert difference.mean() < 1.5 and difference.max() <= 24
        assert np.abs(training.mean() - exact.mean()) < 0.5
      else:
        # The reduced decode smooths what the exact path's 2-8x bilinear
        # shrink aliases: it is the closer of the two to an antialiased resize.
        assert image_size in (32, 16) and scale in (2, 4, 8)
        assert difference.mean() < 6.0
        assert np.abs(training.mean() - exact.mean()) < 2.0
        assert np.abs(training - smooth).mean() < np.abs(exact - smooth).mean()


def _crop_shapes(image_bytes, seed, count, image_size=None):
  dataset = tf.data.Dataset.from_tensors(image_bytes).repeat(count).map(
      lambda b: tf.shape(image_ops.decode_random_crop(b, seed, image_size))[:2])
  return np.array([s.numpy() for s in dataset])


def test_the_same_seed_takes_the_same_windows_at_any_decode_scale():
  data = tf.constant(_encoded(_photo_array(), "JPEG"))
  full = _crop_shapes(data, 7, 40)
  scaled = _crop_shapes(data, 7, 40, image_size=32)
  scales = [int(image_ops.dct_scale(tf.constant([0, 0, *shape]), 32)) for shape in full]
  assert set(scales) == {2, 4}
  for shape, new, scale in zip(full, scaled, scales):
    # The covering scaled window of each full-size window: at most one pixel more a side.
    assert np.all(new >= np.ceil(shape / scale)) and np.all(new <= shape / scale + 2)
  mapped = tf.data.Dataset.from_tensors(data).map(
      lambda b: image_ops.preprocess_for_train(b, 32))
  assert mapped.element_spec.shape == (32, 32, 3)
  assert next(iter(mapped)).shape == (32, 32, 3)


# --- keyed (stateless) draws: --deterministic ---------------------------------------------------


def _keys(count, seed=7):
  return [tf.constant([seed, k], tf.int64) for k in range(count)]


def test_a_key_takes_the_same_window_eagerly_in_a_map_and_in_either_format():
  array = _photo_array()
  jpeg, png = (tf.constant(_encoded(array, fmt)) for fmt in ("JPEG", "PNG"))
  keys = _keys(40)
  eager = np.array([tf.shape(image_ops.decode_random_crop(jpeg, key=k))[:2].numpy()
                    for k in keys])
  mapped = np.array([s.numpy() for s in tf.data.Dataset.from_tensor_slices(tf.stack(keys)).map(
      lambda k: tf.shape(image_ops.decode_random_crop(png, key=k))[:2],
      num_parallel_calls=4, deterministic=True)])
  np.testing.assert_array_equal(eager, mapped)
  again = np.array([tf.shape(image_ops.decode_random_crop(jpeg, key=k))[:2].numpy()
                    for k in keys])
  np.testing.assert_array_equal(eager, again)
  assert len({tuple(s) for s in eager}) > 10  # keys differ, windows differ
  # The stateless draw samples the same law as the seeded one.
  area, _ = _area_and_aspect(eager)
  assert area.min() >= 0.49 and area.max() <= 1.0 and area.std() > 0.1


def test_a_key_draws_the_same_augmentation_eagerly_and_in_a_map():
  keys = _keys(3)
  eager = [image_ops.draw_augmentation(16, key=k).numpy() for k in keys]

  def mapped():
    return list(tf.data.Dataset.from_tensor_slices(tf.stack(keys)).map(
        lambda k: image_ops.draw_augmentation(16, key=k), num_parallel_calls=3,
        deterministic=True).as_numpy_iterator())

  first_map, second_map = mapped(), mapped()
  for draws, in_map, again in zip(eager, first_map, second_map):
    np.testing.assert_array_equal(in_map, again)  # bit for bit, map to map
    # A graph folds the delta's constants: last-bit differences from eager.
    np.testing.assert_allclose(draws, in_map, rtol=1e-6)
  assert eager[0].shape == (16, 3) and not np.array_equal(eager[0], eager[1])
  assert set(np.unique(eager[0][:, 0])) <= {0.0, 1.0}
  images = tf.zeros([16, 8, 8, 3], tf.uint8) + 100
  np.testing.assert_array_equal(image_ops.augment_batch(images, key=keys[2]).numpy(),
                                image_ops.augment_batch(images, key=keys[2]).numpy())
