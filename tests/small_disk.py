"""A small disk for tests: a real tmpfs where the machine allows mounting one, else a stand-in.

The stand-in (`install`) makes every write through TensorFlow's Python file
API (GFile, TFRecordWriter) under a directory raise the error a full disk
raises — `ResourceExhaustedError: PATH; No space left on device` — once the
bytes written there pass a quota. Checkpoint data written by TF's C++ ops is
not counted; the meta graph and graph.pbtxt, which a full disk also stops, are.

    python tests/small_disk.py DIR QUOTA_BYTES program.py ARGS...

runs program.py with the stand-in installed (tests use it in subprocesses).
"""

import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import threading

# Tests set this to try the stand-in on a machine that could mount a tmpfs.
FORCE_STAND_IN = "ESTIMATOR_TPU_TEST_DISK_STAND_IN"
FILLER = "filler.bin"


def try_mount_tmpfs(directory, size_bytes):
  """Mounts a tmpfs of size_bytes at directory; whether it worked."""
  if os.environ.get(FORCE_STAND_IN) or os.geteuid() != 0 or not shutil.which("mount"):
    return False
  os.makedirs(directory, exist_ok=True)
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs",
                         directory], capture_output=True)
  return done.returncode == 0


def unmount(directory):
  subprocess.run(["umount", directory], check=False)


class SmallDisk:
  """`directory` holds at most `size_bytes`; `command(argv)` runs a program writing there."""

  def __init__(self, size_bytes):
    self.directory = tempfile.mkdtemp(prefix="small-disk-")
    self.size_bytes = size_bytes
    self.is_tmpfs = try_mount_tmpfs(self.directory, size_bytes)

  def command(self, argv):
    """argv of a Python program (argv[0] a script), run against this disk."""
    if self.is_tmpfs:
      return [sys.executable, *argv]
    return [sys.executable, os.path.abspath(__file__), self.directory, str(self.size_bytes),
            *argv]

  def used_bytes(self):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(self.directory) for name in names)

  def fill(self, leave_bytes):
    """Fills the disk (a filler file) until only leave_bytes are free."""
    if self.is_tmpfs:
      free = shutil.disk_usage(self.directory).free
      with open(os.path.join(self.directory, FILLER), "wb") as f:
        f.write(b"\0" * max(free - leave_bytes, 0))
    else:
      self.size_bytes = self.used_bytes() + leave_bytes

  def unfill(self):
    """Frees the space fill() took."""
    if self.is_tmpfs:
      os.remove(os.path.join(self.directory, FILLER))
    else:
      self.size_bytes = 50 * 2**30

  def close(self):
    if self.is_tmpfs:
      unmount(self.directory)
    shutil.rmtree(self.directory, ignore_errors=True)


def install(directory, quota_bytes):
  """Patches TF's Python writers so that writes under directory fail past quota_bytes.

  quota_bytes counts what the directory holds already: a write fails once
  that plus what this process wrote there passes it.
  """
  import tensorflow as tf
  from tensorflow.python.lib.io import file_io

  directory = os.path.abspath(directory) + os.sep
  lock = threading.Lock()
  written = [sum(os.path.getsize(os.path.join(root, name))
                 for root, _, names in os.walk(directory) for name in names)]

  def charge(path, data):
    path = os.path.abspath(os.fsdecode(path))
    if not path.startswith(directory):
      return
    with lock:
      written[0] += len(data)
      if written[0] > quota_bytes:
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{path}; No space left on device")

  file_io_write = file_io.FileIO.write

  def write(self, file_content):
    charge(self.name, file_content)
    return file_io_write(self, file_content)

  record_init = tf.io.TFRecordWriter.__init__
  record_write = tf.io.TFRecordWriter.write

  def init(self, path, *args, **kwargs):
    record_init(self, path, *args, **kwargs)
    self._small_disk_path = path

  def write_record(self, record):
    charge(self._small_disk_path, record)
    return record_write(self, record)

  file_io.FileIO.write = write
  tf.io.TFRecordWriter.__init__ = init
  tf.io.TFRecordWriter.write = write_record


if __name__ == "__main__":
  target_dir, quota, program, *args = sys.argv[1:]
  install(target_dir, int(quota))
  sys.argv = [program, *args]
  sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
  runpy.run_path(program, run_name="__main__")
