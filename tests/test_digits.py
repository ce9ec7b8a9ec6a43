"""Tests of datasets: the bundled digits as RGB JPEG class folders."""

import io
import os
import subprocess
import sys

from conftest import program_env
import numpy as np
from PIL import Image

from estimator_tpu.data import digits as datasets


def test_digit_arrays_are_rgb_uint8_with_ink_on_white():
  images, labels = datasets.digit_arrays(limit=20, size=24)
  assert images.shape == (20, 24, 24, 3) and images.dtype == np.uint8
  assert labels.shape == (20,) and labels.dtype == np.int64
  assert list(labels[:10]) == list(range(10))  # sklearn's order.
  assert (images[..., 0] == images[..., 2]).all()  # Gray in RGB.
  assert images.max() > 240 and images.min() < 60  # White paper, dark ink.


def test_encode_jpeg_decodes_to_nearly_the_same_pixels():
  images, _ = datasets.digit_arrays(limit=1)
  decoded = Image.open(io.BytesIO(datasets.encode_jpeg(images[0])))
  assert (decoded.format, decoded.mode, decoded.size) == ("JPEG", "RGB",
                                                          (32, 32))
  error = np.abs(np.asarray(decoded, np.float32) - images[0])
  assert error.mean() < 3


def test_write_digits_writes_one_folder_per_class(tmp_path):
  assert datasets.write_digits(str(tmp_path), limit=25, size=16) == 25
  assert sorted(os.listdir(tmp_path)) == datasets.digit_class_names()
  counts = {name: len(os.listdir(tmp_path / name)) for name in os.listdir(
      tmp_path)}
  assert sum(counts.values()) == 25 and min(counts.values()) >= 2
  assert Image.open(tmp_path / "0" / "0000.jpg").size == (16, 16)


def test_command_line_writes_and_refuses_tiny_sizes(tmp_path):
  cmd = [sys.executable, "-m", "estimator_tpu.data.digits", "digits",
         str(tmp_path / "out")]
  done = subprocess.run(cmd + ["--limit=10"], capture_output=True, text=True,
                        check=True, env=program_env())
  assert "wrote 10 digit JPEGs (32x32)" in done.stdout
  refused = subprocess.run(cmd + ["--size=4"], capture_output=True, text=True,
                           env=program_env())
  assert refused.returncode == 2 and "--size=4 must be at least 8" in (
      refused.stderr)
