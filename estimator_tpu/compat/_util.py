"""One-line notes, logged once per process at INFO, for legacy code made to work.

INFO, not WARNING: the behaviour they describe is what a legacy program asked
for (a CPU run of TPU code), so a default run stays quiet; a program that sets
`tf.logging.set_verbosity(tf.logging.INFO)`, as TF 1 programs did, sees each once,
on TensorFlow's logger and in its format, among the program's own records.
"""

import threading

from estimator_tpu import tf_logger

_noted = set()
_lock = threading.Lock()


def note_once(key, message, *args):
  """Logs `message % args` at INFO the first time `key` is seen."""
  with _lock:
    if key in _noted:
      return
    _noted.add(key)
  tf_logger.info(message, *args)
