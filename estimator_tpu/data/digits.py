"""Bundled demo data: the UCI handwritten digits that scikit-learn ships, as RGB JPEGs.

    python -m estimator_tpu.data.digits digits OUT_DIR [--size=32] [--limit=N]

writes OUT_DIR/<class>/<index>.jpg, one folder per digit, with no download.
"""

import argparse
import io
import os
import sys

import numpy as np
from PIL import Image

DIGIT_SIZE = 32
JPEG_QUALITY = 95


def digit_class_names():
  """The ten class names, in label order."""
  return [str(d) for d in range(10)]


def digit_arrays(limit=None, size=DIGIT_SIZE):
  """The digits as RGB uint8 arrays.

  Args:
    limit: keep only the first `limit` images (all 1,797 when None).
    size: side of the square output images in pixels.

  Returns:
    (images [n, size, size, 3] uint8, labels [n] int64).
  """
  from sklearn.datasets import load_digits
  digits = load_digits()
  images, labels = digits.images, digits.target
  if limit is not None:
    images, labels = images[:limit], labels[:limit]
  out = np.empty((len(images), size, size, 3), np.uint8)
  for i, image in enumerate(images):
    # 0..16 ink on white paper, scaled up smoothly like a scanned digit.
    gray = Image.fromarray((255 - image * (255 / 16)).astype(np.uint8), "L")
    out[i] = np.asarray(gray.resize((size, size), Image.BICUBIC).convert("RGB"))
  return out, labels.astype(np.int64)


def encode_jpeg(array, quality=JPEG_QUALITY):
  """Encodes an RGB uint8 array [height, width, 3] as JPEG bytes."""
  buffer = io.BytesIO()
  Image.fromarray(array, "RGB").save(buffer, format="JPEG", quality=quality)
  return buffer.getvalue()


def write_digits(out_dir, limit=None, size=DIGIT_SIZE):
  """Writes the digits as OUT_DIR/<class>/<index>.jpg; returns the number written."""
  images, labels = digit_arrays(limit=limit, size=size)
  names = digit_class_names()
  for name in names:
    os.makedirs(os.path.join(out_dir, name), exist_ok=True)
  for index, (image, label) in enumerate(zip(images, labels)):
    path = os.path.join(out_dir, names[label], f"{index:04d}.jpg")
    with open(path, "wb") as f:
      f.write(encode_jpeg(image))
  return len(images)


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m estimator_tpu.data.digits",
      description="Write a bundled data set as one folder of JPEGs per class.")
  parser.add_argument("name", choices=["digits"])
  parser.add_argument("out_dir")
  parser.add_argument("--size", type=int, default=DIGIT_SIZE,
                      help="side of the square JPEGs in pixels")
  parser.add_argument("--limit", type=int, default=None,
                      help="write only the first N images")
  args = parser.parse_args(argv)
  if args.size < 8:
    parser.error(f"--size={args.size} must be at least 8")
  count = write_digits(args.out_dir, limit=args.limit, size=args.size)
  print(f"wrote {count} digit JPEGs ({args.size}x{args.size}) in 10 class "
        f"folders under {args.out_dir}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
