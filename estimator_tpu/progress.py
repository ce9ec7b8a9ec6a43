"""A long job's progress: a live line on a terminal (tqdm), else a plain line now and then.

On a terminal, tqdm redraws one line in place (count / total, a bar, what the
job adds, rate, time left) at most a few times a second; lines the program
prints meanwhile go through write(), which puts them above it. Where the
output is not a terminal (CI, a log file, a test reading it), a plain line
every ESTIMATOR_TPU_PROGRESS_SECS seconds (default 60; 0: none), so a log
grows by a bounded amount whatever the job's length.
"""

import os
import sys
import time

import tqdm

ENV = "ESTIMATOR_TPU_PROGRESS_SECS"
DEFAULT_PLAIN_SECS = 60.0
_LIVE_REDRAW_SECS = 0.5
_live = []  # the live lines on screen: write() puts text above them


def plain_secs():
  """Seconds between plain progress lines (ESTIMATOR_TPU_PROGRESS_SECS; 0: none)."""
  value = os.environ.get(ENV, "")
  try:
    return max(float(value), 0.0) if value else DEFAULT_PLAIN_SECS
  except ValueError:
    raise ValueError(f"{ENV}={value!r} is not a number of seconds (0 turns progress off)") \
        from None


def duration(seconds):
  """`42s`, `3m05s` or `2h07m`."""
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"


def write(line, file=None):
  """Prints line (on stdout by default), above the live progress lines if there are any."""
  file = file or sys.stdout
  if _live:
    tqdm.tqdm.write(line, file=file)
    file.flush()
  else:
    print(line, file=file, flush=True)


class Progress:
  """One job's progress: update() as it goes, close() at the end (or use it as a context).

  Args:
    total: the count at the end (steps, images).
    noun: what is counted, for the line ("step", "images").
    plain: plain(done, total, rate_per_sec, secs_left, details) -> the plain line.
    initial: the count already done when the job starts (a resumed run's step).
    stream: where the live line goes (stderr); a stream that is not a terminal
      gets plain lines instead, through say.
    say: prints a plain line (default: write()).
    every_secs: seconds between plain lines (default: plain_secs()).
  """

  def __init__(self, total, noun, plain, initial=0, stream=None, say=None, every_secs=None):
    self.total, self._plain, self._say = total, plain, say or write
    self._stream = stream or sys.stderr
    self._every = plain_secs() if every_secs is None else every_secs
    self._done, self._details = initial, ""
    self._start_count, self._start = initial, time.monotonic()
    self._last_plain = self._last_update = self._start
    self._bar = None
    if self._every and _is_terminal(self._stream):
      self._bar = tqdm.tqdm(
          total=total, initial=initial, file=self._stream, leave=False, dynamic_ncols=True,
          mininterval=_LIVE_REDRAW_SECS, unit=noun,
          # What the job adds goes in {desc}: tqdm's {postfix} starts with ", ".
          bar_format=f"{{n_fmt}}/{{total_fmt}} {noun} |{{bar:24}}| {{desc}} "
                     "[{elapsed}<{remaining}]")
      _live.append(self._bar)

  def rate(self):
    """Counted per second since the start (or resume)."""
    return (self._done - self._start_count) / max(time.monotonic() - self._start, 1e-9)

  def secs_left(self):
    rate = self.rate()
    return (self.total - self._done) / rate if rate > 0 else None

  def due(self):
    """Whether an update() now would show something (a redraw, or a plain line).

    A job whose count costs something to read (a session.run) reads it only then.
    """
    now = time.monotonic()
    if self._bar is not None:
      return now - self._last_update >= _LIVE_REDRAW_SECS
    return bool(self._every) and now - self._last_plain >= self._every

  def update(self, done, details=""):
    """The job has done `done` of total; details: what it adds to the line (e.g. the loss)."""
    self._done, self._details = done, details
    self._last_update = time.monotonic()
    if self._bar is not None:
      self._bar.set_description_str(details, refresh=False)
      self._bar.update(done - self._bar.n)
      return
    now = time.monotonic()
    if self._every and now - self._last_plain >= self._every:
      self._last_plain = now
      self._say(self._plain(done, self.total, self.rate(), self.secs_left(), details))

  def close(self):
    """Takes the live line off the screen."""
    if self._bar is not None:
      self._bar.close()
      _live.remove(self._bar)
      self._bar = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _is_terminal(stream):
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False
