"""Pure tensor functions: decode, preprocess_for_train and preprocess_for_eval.

Evaluation and serving share preprocess_for_eval, so a served model sees
exactly what evaluation saw: the central crop of the run's --eval_crop in
the run's --eval_crop_form (only that window of a JPEG is decoded), resized
to the network's size. Random
augmentation happens only in training, never as layers of the network, so an
exported model never augments.

Training works in two stages so the host does little per pixel: per image,
decode only a random crop window of a JPEG (at a reduced DCT scale when the
window is at least twice the training size) and resize it to whole pixel
values (decode_random_crop, resize_crop); per batch, flip, colour jitter and
normalize in one pass (apply_augmentation), XLA-compiled on the host
(augment_batch) or run on the accelerator inside the model_fn. Training
decodes trade exact pixels for speed within documented tolerances
(decode_random_crop); evaluation decodes exactly.
"""

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.data import crop_forms

# ImageNet channel statistics on the 0..255 scale (tensorflow/tpu's values).
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_AREA_RANGE = (0.5, 1.0)
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
CROP_MIN_OBJECT_COVERED = 0.1
CROP_MAX_ATTEMPTS = 10
BRIGHTNESS_DELTA = 32.0 / 255.0
CONTRAST_RANGE = (0.8, 1.2)
_INT32_MAX = 2 ** 31 - 1
# Training decodes: libjpeg's merged chroma upsampling takes ~5% less decode
# time than its default (fancy) interpolation and moves pixels by ~1 level on
# average (decode_random_crop); the scales dct_scale picks from.
JPEG_FANCY_UPSCALING = False
DCT_SCALES = (1, 2, 4, 8)


def decode_image(image_bytes):
  """Decodes JPEG, PNG, GIF or BMP bytes (any channel count) to RGB.

  Args:
    image_bytes: scalar string tensor.

  Returns:
    uint8 tensor [height, width, 3].
  """
  image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
  image.set_shape([None, None, 3])
  return image


def normalize(image):
  """Float image on the 0..255 scale -> zero mean, unit variance per channel."""
  image = tf.cast(image, tf.float32)
  return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def resize_for_eval(image, image_size):
  """Deterministic resize of a decoded image to [image_size, image_size, 3] float32."""
  image = tf.image.resize(image, [image_size, image_size],
                          method=tf.image.ResizeMethod.BILINEAR, antialias=True)
  image = normalize(image)
  image.set_shape([image_size, image_size, 3])
  return image


# --eval_crop_form: what --eval_crop keeps (data/crop_forms.py says what each form is).
SQUARE = crop_forms.SQUARE
PER_SIDE = crop_forms.PER_SIDE
CROP_FORMS = crop_forms.CROP_FORMS


def central_window(image_shape, central_fraction):
  """The centred window keeping central_fraction of each side, as tf.image.central_crop.

  Args:
    image_shape: int32 [2 or 3], the image's [height, width, ...].
    central_fraction: Python float in (0, 1].

  Returns:
    int32 [4]: [offset_height, offset_width, height, width], at least 1x1,
    the window tf.image.decode_and_crop_jpeg takes.
  """
  size = tf.cast(image_shape[:2], tf.float64)
  offset = tf.cast(tf.floor((size - size * central_fraction) / 2.0), tf.int32)
  window = tf.maximum(tf.cast(image_shape[:2], tf.int32) - 2 * offset, 1)
  offset = tf.minimum(offset, tf.cast(image_shape[:2], tf.int32) - window)
  return tf.concat([offset, window], axis=0)


def square_window(image_shape, central_fraction):
  """The centred square of central_fraction of the shorter side, as tensorflow/tpu crops.

  tensorflow/tpu's arithmetic exactly: the side is the float32 product
  truncated to int32, and an odd margin leaves the extra pixel above and to
  the left (offset (height - side + 1) // 2). A 500x375 photo at 0.875 keeps
  328x328 from (24, 86). The side is at least 1 (tensorflow/tpu would ask
  for an empty window on images under 2 px).

  Args:
    image_shape: int32 [2 or 3], the image's [height, width, ...].
    central_fraction: Python float in (0, 1].

  Returns:
    int32 [4]: [offset_height, offset_width, side, side].
  """
  height = tf.cast(image_shape[0], tf.int32)
  width = tf.cast(image_shape[1], tf.int32)
  shorter = tf.cast(tf.minimum(height, width), tf.float32)
  side = tf.maximum(tf.cast(central_fraction * shorter, tf.int32), 1)
  return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


_WINDOWS = {SQUARE: square_window, PER_SIDE: central_window}


def crop_window(image_shape, central_fraction, crop_form):
  """The eval crop's window: square_window or central_window, by crop_form.

  Raises:
    ValueError: crop_form is not one of CROP_FORMS.
  """
  _check_crop_form(crop_form)
  return _WINDOWS[crop_form](image_shape, central_fraction)


def _check_crop_form(crop_form):
  if crop_form not in CROP_FORMS:
    raise ValueError(f"crop form {crop_form!r} is not one of {', '.join(CROP_FORMS)}")


def decode_central_crop(image_bytes, central_fraction, crop_form=PER_SIDE):
  """Encoded bytes -> uint8 [crop_height, crop_width, 3], the central window.

  A JPEG decodes only the window, its size read from the header
  (extract_jpeg_shape, decode_and_crop_jpeg: the same pixels as a full decode
  then a slice, for less work); any other format decodes in full and the
  same window is sliced.

  Args:
    image_bytes: scalar string tensor.
    central_fraction: Python float in (0, 1]; 1.0 is the whole image (in
      either form).
    crop_form: SQUARE (square_window) or PER_SIDE (central_window).
  """
  _check_crop_form(crop_form)  # at 1.0 too, where no window is taken
  if central_fraction >= 1.0:
    return decode_image(image_bytes)
  is_jpeg = tf.io.is_jpeg(image_bytes)

  def jpeg_crop():
    shape = tf.io.extract_jpeg_shape(image_bytes, output_type=tf.int32)
    return tf.image.decode_and_crop_jpeg(
        image_bytes, crop_window(shape, central_fraction, crop_form), channels=3)

  def other_crop():
    image = decode_image(image_bytes)
    return crop_to_window(image, crop_window(tf.shape(image), central_fraction, crop_form))

  crop = tf.cond(is_jpeg, jpeg_crop, other_crop)
  crop.set_shape([None, None, 3])
  return crop


def preprocess_for_eval(image_bytes, image_size, central_fraction=1.0, crop_form=PER_SIDE):
  """Encoded bytes -> normalized float32 [image_size, image_size, 3].

  Args:
    image_bytes: scalar string tensor of JPEG/PNG/GIF/BMP bytes.
    image_size: side of the square output in pixels.
    central_fraction: the run's --eval_crop; 1.0 resizes the whole image.
    crop_form: the run's --eval_crop_form: SQUARE keeps a centred square of
      central_fraction of the shorter side (0.875 of a 500x375 photo: 328x328),
      PER_SIDE central_fraction of each side (438x329, stretched by the resize).
  """
  return resize_for_eval(decode_central_crop(image_bytes, central_fraction, crop_form),
                         image_size)


def sample_crop_window(image_shape, seed=None, key=None):
  """A random crop of 50-100% of the area and aspect ratio 3/4-4/3.

  Args:
    image_shape: int32 [3], the image's [height, width, channels].
    seed: op-level seed, or None.
    key: int64 [2], or None: draw with the stateless op instead, the same
      window for the same key whatever else has been drawn (seed is unused).

  Returns:
    int32 [4]: [offset_height, offset_width, height, width], the window
    tf.image.decode_and_crop_jpeg takes.
  """
  options = dict(bounding_boxes=tf.zeros([1, 0, 4]),
                 min_object_covered=CROP_MIN_OBJECT_COVERED,
                 aspect_ratio_range=CROP_ASPECT_RANGE, area_range=CROP_AREA_RANGE,
                 max_attempts=CROP_MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True)
  if key is None:
    begin, size, _ = tf.image.sample_distorted_bounding_box(image_shape, seed=seed, **options)
  else:
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape, seed=key, **options)
  return tf.stack([begin[0], begin[1], size[0], size[1]])


def crop_to_window(image, window):
  """The window [offset_height, offset_width, height, width] of a decoded image."""
  return tf.slice(image, tf.stack([window[0], window[1], 0]),
                  tf.stack([window[2], window[3], -1]))


def random_crop(image, seed=None, key=None):
  """A random crop (sample_crop_window, seed or key) of a decoded uint8 [height, width, 3] image."""
  return crop_to_window(image, sample_crop_window(tf.shape(image), seed, key))


def dct_scale(window, image_size):
  """The JPEG decode scale for a crop window: 8, 4, 2 or 1 (full size).

  libjpeg decodes at 1/2, 1/4 or 1/8 of the size by inverse-transforming
  fewer coefficients per 8x8 block: less work per block and fewer pixels out,
  smoothed rather than aliased. The largest scale that leaves the window at
  least image_size on both sides is taken, so the resize still only shrinks.

  Args:
    window: int32 [4], [offset_height, offset_width, height, width].
    image_size: the side the crop is resized to.

  Returns:
    int32 scalar: 8, 4, 2, or 1 when the window is under 2 x image_size on a side.
  """
  side = tf.minimum(window[2], window[3])
  scale = tf.constant(1)
  for candidate in (2, 4, 8):
    scale = tf.where(side >= candidate * image_size, candidate, scale)
  return scale


def scale_window(window, scale):
  """The window in the coordinates of the image decoded at 1/scale.

  decode_and_crop_jpeg with ratio=scale takes its window in the scaled
  image, which is ceil(height / scale) x ceil(width / scale): the smallest
  scaled window that covers the original one.
  """
  begin = window[:2] // scale
  end = -((-(window[:2] + window[2:])) // scale)  # ceil division
  return tf.concat([begin, end - begin], axis=0)


def _decode_jpeg_window(image_bytes, window, scale):
  """A window of a JPEG decoded at 1/scale, chroma upsampled by replication."""
  return tf.image.decode_and_crop_jpeg(
      image_bytes, scale_window(window, scale), channels=3, ratio=scale,
      fancy_upscaling=JPEG_FANCY_UPSCALING)


def decode_random_crop(image_bytes, seed=None, image_size=None, key=None):
  """Encoded bytes -> uint8 [crop_height, crop_width, 3], a random crop.

  A JPEG (recognised by its first bytes) decodes only the crop window, its
  size read from the header; any other format decodes in full and is
  cropped. Both sample the window from the same distribution
  (sample_crop_window) on the image's full size, so the same seed takes the
  same windows.

  A JPEG window is decoded with libjpeg's merged chroma upsampling
  (JPEG_FANCY_UPSCALING) and, given image_size, at the reduced scale of
  dct_scale when it is at least twice image_size on both sides (photos much
  larger than the training crop); the crop is then the covering window of
  the scaled image (scale_window), 1/scale of the size. What this costs in
  pixels, after resize_crop, against the exact decode, crop and resize, on
  generated grainy photo JPEGs (tests/test_image_ops.py holds the
  tolerances):
  - full scale (merged upsampling only): mean abs difference 0.9 levels of
    255, at most 16 (chroma edges); tolerance mean < 1.5, max <= 24;
  - reduced scale: mean 3.9 / 5.2 / 7.6 levels at scale 2 / 4 / 8, nearly
    all of it the aliasing of the exact path's 2-8x bilinear shrink (no
    antialiasing): against an antialiased resize of the exact crop the
    reduced decode is the closer of the two (2.1 / 3.2 / 5.3 levels against
    3.6 / 4.2 / 5.6); tolerance: closer than the exact path.

  Args:
    image_bytes: scalar string tensor.
    seed: op-level seed for the window, or None.
    image_size: the side the crop will be resized to; None: decode at full scale.
    key: int64 [2] stateless key for the window instead of seed, or None
      (sample_crop_window).

  Returns:
    uint8 [height, width, 3] with a dynamic height and width.
  """
  is_jpeg = tf.io.is_jpeg(image_bytes)

  def jpeg_shape():
    shape = tf.io.extract_jpeg_shape(image_bytes, output_type=tf.int32)
    return shape, tf.zeros([0, 0, 3], tf.uint8)

  def decoded_shape():
    image = decode_image(image_bytes)
    return tf.shape(image), image

  shape, decoded = tf.cond(is_jpeg, jpeg_shape, decoded_shape)
  window = sample_crop_window(shape, seed, key)
  scale = tf.constant(1) if image_size is None else dct_scale(window, image_size)
  # Branch 0 crops the decoded image; branch 1 + i decodes at DCT_SCALES[i]
  # (decode_and_crop_jpeg takes its scale as an attribute, not a tensor).
  branches = [lambda: crop_to_window(decoded, window)] + [
      lambda scale=scale: _decode_jpeg_window(image_bytes, window, scale)
      for scale in DCT_SCALES]
  scale_index = tf.argmax(tf.equal(tf.constant(DCT_SCALES), scale), output_type=tf.int32)
  branch = tf.where(is_jpeg, 1 + scale_index, 0)
  crop = tf.switch_case(branch, branches)
  crop.set_shape([None, None, 3])
  return crop


def resize_crop(crop, image_size, dtype=tf.uint8):
  """A crop -> [image_size, image_size, 3] whole pixel values, bilinear, rounded.

  No antialiasing: a training crop of a photo shrinks by about 1-2x, where
  bilinear already averages the neighbouring pixels, and the antialiased
  kernel costs ~5x more CPU per image.

  Args:
    crop: uint8 [height, width, 3].
    image_size: output side in pixels.
    dtype: tf.uint8, or tf.bfloat16 (which holds 0..255 exactly) for a TPU,
      whose infeed takes no uint8.
  """
  image = tf.image.resize(crop, [image_size, image_size],
                          method=tf.image.ResizeMethod.BILINEAR, antialias=False)
  # Bilinear weights sum to 1, so a uint8 input stays within 0..255.
  image = tf.cast(tf.floor(image + 0.5), dtype)
  image.set_shape([image_size, image_size, 3])
  return image


def draw_augmentation(batch_size, random_flip=True, seed=None, key=None):
  """Each image's random flip, brightness delta and contrast factor.

  Drawn as tf.image.random_* draw them: flip with probability 0.5, delta
  uniform within +-BRIGHTNESS_DELTA of the 0..1 range, factor uniform in
  CONTRAST_RANGE.

  Args:
    batch_size: images in the batch (a Python int or a scalar tensor).
    random_flip: False: no image is flipped.
    seed: op-level seed for reproducible draws, or None.
    key: int64 [2], or None: the stateless key of the draws instead (the same
      draws for the same key whatever else has been drawn; seed is unused).

  Returns:
    float32 [batch_size, 3]: flip (1.0 or 0.0), delta on the 0..255 scale,
    contrast factor; what apply_augmentation takes.
  """
  if key is None:
    # A stateful draw (varies per call) seeds the stateless draws.
    key = tf.random.uniform([2], 0, _INT32_MAX, dtype=tf.int32, seed=seed)
  uniforms = tf.random.stateless_uniform([batch_size, 3], key)
  flip = tf.cast(uniforms[:, 0] < 0.5, tf.float32) if random_flip else tf.zeros_like(
      uniforms[:, 0])
  delta = (2.0 * uniforms[:, 1] - 1.0) * BRIGHTNESS_DELTA * 255.0
  low, high = CONTRAST_RANGE
  factor = low + (high - low) * uniforms[:, 2]
  return tf.stack([flip, delta, factor], axis=1)


def _channel_means(images, hwcn):
  """Each image's per-channel mean of float32 images, shaped to broadcast against them.

  A dot product with ones over the rows, then a sum over the columns: on the
  host XLA runs this ~3x faster than reduce_mean over both spatial axes.
  Sums of whole pixel values stay exact in float32 up to 2**24 (a 256x256
  channel of 255s).
  """
  if hwcn:
    height, width, channels, _ = images.shape.as_list()
    rows = tf.einsum("hk,h->k", tf.reshape(images, [height, -1]), tf.ones([height]))
    sums = tf.reduce_sum(tf.reshape(rows, [width, channels, -1]), axis=0)
    return tf.reshape(sums, [1, 1, channels, -1]) / (height * width)
  _, height, width, channels = images.shape.as_list()
  rows = tf.einsum("bhk,h->bk", tf.reshape(images, [-1, height, width * channels]),
                   tf.ones([height]))
  sums = tf.reduce_sum(tf.reshape(rows, [-1, width, channels]), axis=1)
  return tf.reshape(sums, [-1, 1, 1, channels]) / (height * width)


def apply_augmentation(images, augmentation, hwcn=False):
  """Flip, brightness, contrast, clipping and normalization of a batch.

  Pure tensor math with static shapes: it runs in the host's input pipeline
  (augment_batch) or on the accelerator (model/device_augmentation.py).
  It computes tf.image.adjust_brightness then adjust_contrast (about each
  image's per-channel mean), clipping to the pixel range and normalization
  as one multiply-add, clip and multiply-add per pixel: the brightness delta
  moves the mean by the same delta, and the flip changes no mean, so it
  comes last.

  Args:
    images: [batch, height, width, 3] (or [height, width, 3, batch] with
      hwcn) of any real or integer dtype, values on the 0..255 scale; static
      height and width.
    augmentation: float32 [batch, 3] from draw_augmentation.
    hwcn: images are in the transposed [height, width, 3, batch] layout.

  Returns:
    Normalized float32 images in the layout they came in.
  """
  images = tf.cast(images, tf.float32)
  per_image = [1, 1, 1, -1] if hwcn else [-1, 1, 1, 1]
  width_axis = [1] if hwcn else [2]
  channels = [1, 1, 3, 1] if hwcn else [1, 1, 1, 3]
  delta = tf.reshape(augmentation[:, 1], per_image)
  factor = tf.reshape(augmentation[:, 2], per_image)
  # (x + delta - m') * factor + m' with m' = mean + delta, as one multiply-add.
  offset = _channel_means(images, hwcn) * (1.0 - factor) + delta
  scale = tf.reshape(1.0 / tf.constant(STDDEV_RGB), channels)
  shift = tf.reshape(tf.constant(MEAN_RGB) / tf.constant(STDDEV_RGB), channels)
  images = tf.clip_by_value(images * factor + offset, 0.0, 255.0) * scale - shift
  flip = tf.reshape(augmentation[:, 0] > 0.5, per_image)
  return tf.where(flip, tf.reverse(images, width_axis), images)


# XLA fuses the pixel work into one pass over the batch on the host (where the
# stack's TensorFlow has XLA for the host: not the tpu stack's, see stacks.HOST_XLA).
# No AutoGraph: apply_augmentation branches on Python values only.
_apply_augmentation_compiled = tf.function(apply_augmentation, jit_compile=stacks.HOST_XLA,
                                           autograph=False)


def augment_batch(images, random_flip=True, seed=None, key=None):
  """Random flip, brightness and contrast, then normalization, of a batch.

  Args:
    images: uint8 [batch, height, width, 3] (static height and width).
    random_flip: flip left/right with probability 0.5.
    seed: op-level seed for reproducible augmentation, or None.
    key: int64 [2] stateless key of the draws instead of seed, or None
      (draw_augmentation).

  Returns:
    Normalized float32 [batch, height, width, 3].
  """
  augmentation = draw_augmentation(tf.shape(images)[0], random_flip, seed, key)
  return _apply_augmentation_compiled(images, augmentation)


def augment_for_train(image, image_size, random_flip=True, seed=None):
  """Random crop, flip, brightness and contrast of a decoded image.

  Args:
    image: uint8 tensor [height, width, 3].
    image_size: output side in pixels.
    random_flip: flip left/right with probability 0.5 (off for data whose
      meaning changes when mirrored, like digits or text).
    seed: op-level seed for reproducible augmentation, or None.

  Returns:
    Normalized float32 tensor [image_size, image_size, 3].
  """
  image = resize_crop(random_crop(image, seed), image_size)
  return augment_batch(image[tf.newaxis], random_flip, seed)[0]


def preprocess_for_train(image_bytes, image_size, random_flip=True, seed=None):
  """Encoded bytes -> augmented, normalized float32 [image_size, image_size, 3]."""
  image = resize_crop(decode_random_crop(image_bytes, seed, image_size), image_size)
  return augment_batch(image[tf.newaxis], random_flip, seed)[0]
