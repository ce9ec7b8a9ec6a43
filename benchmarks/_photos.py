"""Generated photo-sized JPEG records for the benchmarks: textured images, no downloads."""

import io
import os

import numpy as np
from PIL import Image

from estimator_tpu import testing
from estimator_tpu.data import layout
from estimator_tpu.data import schema

WIDTH, HEIGHT = 500, 375
JPEG_QUALITY = 90
# Per-pixel noise (standard deviation, 0..255 scale): with the blobs and
# gradients below it makes a quality-90 JPEG of ~70 KB, as a 500x375 photo is.
GRAIN = 11.0
BLOB_CELL = 25  # pixels per cell of the smooth random field


def photo_array(rng, width=WIDTH, height=HEIGHT):
  """uint8 [height, width, 3]: per-channel gradient, smooth blobs and fine grain."""
  y, x = np.mgrid[0:height, 0:width].astype(np.float32)
  image = np.empty((height, width, 3), np.float32)
  for c in range(3):
    a, b = rng.uniform(-1.0, 1.0, 2)
    cells = rng.normal(0.0, 40.0, (height // BLOB_CELL + 1, width // BLOB_CELL + 1))
    blobs = Image.fromarray(cells.astype(np.float32)).resize((width, height), Image.BICUBIC)
    image[..., c] = 128.0 + 60.0 * (a * x / width + b * y / height) + np.asarray(blobs)
  image += rng.normal(0.0, GRAIN, image.shape)
  return np.clip(image, 0, 255).astype(np.uint8)


def jpeg_bytes(array):
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format="JPEG", quality=JPEG_QUALITY)
  return buffer.getvalue()


def write_photo_records(out_dir, count=320, num_classes=10, shards=4, seed=0,
                        width=WIDTH, height=HEIGHT):
  """Writes `count` width x height photo JPEGs as preprocess.py's training shards.

  Returns:
    (training file pattern, mean JPEG size in bytes).
  """
  os.makedirs(out_dir, exist_ok=True)
  rng = np.random.default_rng(seed)
  jpegs = [jpeg_bytes(photo_array(rng, width, height)) for _ in range(count)]
  for shard in range(shards):
    examples = [schema.make_example(jpegs[i], i % num_classes, str(i % num_classes),
                                    height, width, f"photo{i}.jpg")
                for i in range(shard, count, shards)]
    testing.write_records(os.path.join(out_dir, layout.shard_name("train", shard, shards)),
                          examples)
  return os.path.join(out_dir, "train-*"), sum(map(len, jpegs)) / count
