"""The pure core of preprocessing: one image file's bytes -> an RGB JPEG tf.Example, or a reason.

No Beam here: the DoFns in pipeline.py call these per image, and the tests
call them directly.
"""

import dataclasses
import io

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
import numpy as np
from PIL import Image

from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.data import schema

JPEG_QUALITY = 95
# Image.open tries formats in order; most inputs are JPEG or PNG.
_COMMON_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP", "TIFF")


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


def image_formats():
  """Every format PIL reads, the common ones first (tried in this order)."""
  Image.init()
  return tuple(_COMMON_FORMATS) + tuple(
      f for f in Image.ID if f not in _COMMON_FORMATS)


def _open_and_load(image_bytes, max_size):
  """Decodes the whole image once; returns (image, needs_resize)."""
  try:
    image = Image.open(io.BytesIO(image_bytes), formats=image_formats())
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
  # Map keys sorted: the same bytes from every process (a map's order follows
  # string hashes, which differ from one process to the next).
  return EncodedExample(example.SerializeToString(deterministic=True), image.height, image.width,
                        image.converted)


def read_file(path):
  """Returns a file's bytes (local or any Beam filesystem, e.g. gs://).

  Raises:
    RejectedInput: the file is missing or unreadable.
  """
  try:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
      return f.read()
  except Exception as e:  # Each filesystem raises its own types.
    if not FileSystems.exists(path):
      raise plan_lib.RejectedInput(plan_lib.FILE_NOT_FOUND,
                                   "no such file") from e
    raise plan_lib.RejectedInput(plan_lib.READ_ERROR, str(e)) from e
