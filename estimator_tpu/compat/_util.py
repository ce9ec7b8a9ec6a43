"""One-line warnings, logged once per process, for legacy code made to work."""

import threading

from absl import logging

_warned = set()
_lock = threading.Lock()


def warn_once(key, message, *args):
  """Logs `message % args` as a warning the first time `key` is seen."""
  with _lock:
    if key in _warned:
      return
    _warned.add(key)
  logging.warning(message, *args)
