"""How many inputs the pipeline's DoFns in this process have encoded and rejected so far.

Beam's counters (preprocess/images, preprocess/rejected) reach the program
only when the pipeline is done; preprocess.py's progress line reads this
instead while it runs. It counts in the process the DoFns run in: the
DirectRunner's threads (the default) share it with the program; workers in
other processes (multi_processing, Dask, Dataflow) keep their own.
"""

import threading

_lock = threading.Lock()
_counts = {"encoded": 0, "rejected": 0}


def add(encoded=0, rejected=0):
  """Counts inputs just encoded or rejected."""
  with _lock:
    _counts["encoded"] += encoded
    _counts["rejected"] += rejected


def read():
  """(encoded, rejected) so far."""
  with _lock:
    return _counts["encoded"], _counts["rejected"]


def reset():
  with _lock:
    _counts.update(encoded=0, rejected=0)
