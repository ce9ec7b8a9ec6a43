"""Pure tensor functions: decode, preprocess_for_train and preprocess_for_eval.

Evaluation and serving share preprocess_for_eval, so a served model sees
exactly what evaluation saw; random augmentation happens only in training,
on the CPU host, never as layers inside the model.
"""

import tensorflow as tf

# ImageNet channel statistics on the 0..255 scale (tensorflow/tpu's values).
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_AREA_RANGE = (0.5, 1.0)
CROP_ASPECT_RANGE = (3 / 4, 4 / 3)
BRIGHTNESS_DELTA = 32.0 / 255.0
CONTRAST_RANGE = (0.8, 1.2)


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


def preprocess_for_eval(image_bytes, image_size):
  """Encoded bytes -> normalized float32 [image_size, image_size, 3]."""
  return resize_for_eval(decode_image(image_bytes), image_size)


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
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4]),
      min_object_covered=0.1, aspect_ratio_range=CROP_ASPECT_RANGE,
      area_range=CROP_AREA_RANGE, max_attempts=10,
      use_image_if_no_bounding_boxes=True, seed=seed)
  image = tf.slice(image, begin, size)
  image = tf.image.resize(image, [image_size, image_size],
                          method=tf.image.ResizeMethod.BILINEAR, antialias=True)
  if random_flip:
    image = tf.image.random_flip_left_right(image, seed=seed)
  image = image / 255.0
  image = tf.image.random_brightness(image, BRIGHTNESS_DELTA, seed=seed)
  image = tf.image.random_contrast(image, *CONTRAST_RANGE, seed=seed)
  image = tf.clip_by_value(image, 0.0, 1.0) * 255.0
  image = normalize(image)
  image.set_shape([image_size, image_size, 3])
  return image


def preprocess_for_train(image_bytes, image_size, random_flip=True, seed=None):
  """Encoded bytes -> augmented, normalized float32 [image_size, image_size, 3]."""
  return augment_for_train(decode_image(image_bytes), image_size,
                           random_flip=random_flip, seed=seed)
