"""Files on any file system: atomic small writes, retries of transient errors, a full disk named.

TensorFlow's own gs:// file system already retries each call with backoff
(its RetryingFileSystem) for records, checkpoints and every tf.io.gfile call.
What it leaves to us: the small files this package writes itself (config.json,
eval_history.jsonl, labels) must never be left half-written, a call that still
fails with a transient error is tried again here a few times, and an error
that persists, or a full disk, reaches the user as one line naming the path.
"""

import errno
import os
import shutil
import time
import uuid

import tensorflow as tf

ATTEMPTS = 4
FIRST_DELAY_SECS = 1.0
NO_SPACE_TEXT = "No space left on device"
# The file system behind read_text and friends: tf.io.gfile (tests put a flaky stand-in here).
gfile = tf.io.gfile
sleep = time.sleep


class StorageError(Exception):
  """A file operation that failed for good; the message names the path."""

  def __init__(self, message, path):
    super().__init__(message)
    self.path = path


def _transient_types():
  return (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, ConnectionError,
          TimeoutError)


def is_transient(error):
  """Whether an error is one a later attempt may not meet (network, server busy)."""
  return isinstance(error, _transient_types())


def _chain(error):
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def no_space(error):
  """Whether error (or one it was raised from) is a full disk: ENOSPC in any wrapping."""
  for e in _chain(error):
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return True
    if NO_SPACE_TEXT in str(e):
      return True
  return False


def transient_cause(error):
  """The transient error inside error's chain (e.g. a tf.errors.UnavailableError), or None."""
  return next((e for e in _chain(error) if is_transient(e)), None)


def retry(call, path, what, attempts=ATTEMPTS, first_delay=FIRST_DELAY_SECS):
  """call() tried up to `attempts` times while it fails with a transient error.

  The delay doubles after each failure (1 s, 2 s, 4 s by default).

  Args:
    call: a function of no arguments doing one file operation.
    path: the file it touches, for the message.
    what: the operation in a few words ("reading", "writing").
    attempts: how many calls at most.
    first_delay: seconds before the second attempt.

  Returns:
    What call returned.

  Raises:
    StorageError: the error was still transient after the last attempt.
    Any other error of call, unchanged.
  """
  delay = first_delay
  for attempt in range(1, attempts + 1):
    try:
      return call()
    except Exception as e:
      if not is_transient(e):
        raise
      if attempt == attempts:
        raise StorageError(
            f"{what} {path} failed {attempts} times with a transient error "
            f"({type(e).__name__}: {first_line(e)}); check access to the storage and run "
            "the same command again", path) from e
      sleep(delay)
      delay *= 2


def first_line(error):
  """The first line of an error's message (TF's carry node and stack details after it)."""
  text = getattr(error, "message", None) or str(error)
  return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def exists(path):
  return retry(lambda: gfile.exists(path), path, "checking")


def read_text(path):
  """The text of path (retried while the storage errs transiently)."""

  def read():
    with gfile.GFile(path) as f:
      return f.read()

  return retry(read, path, "reading")


def write_atomically(path, data):
  """Writes data (str or bytes) to path whole or not at all.

  The bytes go to a temporary name beside path that is renamed over it once
  complete: a full disk or a kill leaves the old file (or none), never half of
  the new one.
  """
  temp = f"{path}.tmp-{uuid.uuid4().hex}"
  mode = "wb" if isinstance(data, bytes) else "w"

  def write():
    try:
      with gfile.GFile(temp, mode) as f:
        f.write(data)
      gfile.rename(temp, path, overwrite=True)
    except BaseException:
      _remove_quietly(temp)
      raise

  retry(write, path, "writing")


def _remove_quietly(path):
  try:
    if gfile.exists(path):
      gfile.remove(path)
  except (tf.errors.OpError, OSError):
    pass


def is_local(path):
  return "://" not in path or path.startswith("file://")


def free_bytes(path):
  """Free bytes on the local file system holding path (or its nearest parent), or None."""
  if not is_local(path):
    return None
  path = os.path.abspath(path.removeprefix("file://"))
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def size_text(num_bytes):
  """1536 -> '1.5 KB'."""
  size = float(num_bytes)
  for unit in ("bytes", "KB", "MB", "GB"):
    if size < 1024 or unit == "GB":
      return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
    size /= 1024
  return f"{size:.1f} GB"


def no_space_message(directory, flag, needed_bytes=None, what="writing"):
  """The one line a full disk gets: where, how much is needed and free, what to do."""
  parts = [f"no space left on device {what} under {flag}={directory}"]
  if needed_bytes:
    parts.append(f"it needs about {size_text(needed_bytes)}")
  free = free_bytes(directory)
  if free is not None:
    parts.append(f"{size_text(free)} free")
  return "; ".join(parts)
