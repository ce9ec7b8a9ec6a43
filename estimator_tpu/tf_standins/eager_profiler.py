"""Stand-in for `tensorflow.python.eager.profiler` (TF 2.0's profiler API), which TF 2.16 removed.

TF 1-era TPU programs imported it (`from tensorflow.python.eager import profiler`)
for `start()` / `stop()` / `save(logdir, result)`, `start_profiler_server(port)`
and the `Profiler(logdir)` context manager. They work as TF 2.15 had them, on
the profiler session TensorFlow still has (`_pywrap_profiler.ProfilerSession`):
`stop()` returns the trace as bytes and `save` writes it where TensorBoard's
profile plugin looks (`logdir/plugins/profile/<time>/local.trace`, beside an empty
`*.profile-empty` event file).
"""

import datetime
import os
import threading

EVENT_FILE_SUFFIX = ".profile-empty"

_lock = threading.Lock()
_session = None


class ProfilerAlreadyRunningError(Exception):
  pass


class ProfilerNotRunningError(Exception):
  pass


def start(options=None):
  """Starts profiling this process.

  Raises:
    ProfilerAlreadyRunningError: a session (this API's, or the profiler server's) is running.
  """
  global _session
  from tensorflow.python.eager import context
  from tensorflow.python.framework import errors
  from tensorflow.python.profiler.internal import _pywrap_profiler
  with _lock:
    if _session is not None:
      raise ProfilerAlreadyRunningError("Another profiler is running.")
    if context.default_execution_mode == context.EAGER_MODE:
      context.ensure_initialized()
    session = _pywrap_profiler.ProfilerSession()
    try:
      session.start("", options if options is not None else {})
    except errors.AlreadyExistsError:
      raise ProfilerAlreadyRunningError(
          "Another profiler is running (a profiler server started in this process?).") from None
    _session = session


def stop():
  """Stops profiling; returns the trace (bytes) for save().

  Raises:
    ProfilerNotRunningError: no session is running.
  """
  global _session
  from tensorflow.python.eager import context
  with _lock:
    if _session is None:
      raise ProfilerNotRunningError("Cannot stop profiling. No profiler is running.")
    if context.default_execution_mode == context.EAGER_MODE:
      context.context().executor.wait()
    result = _session.stop()
    _session = None
  return result


def maybe_create_event_file(logdir):
  """Writes the empty event file that makes TensorBoard list `logdir`'s profiles, once."""
  from tensorflow.python.client import _pywrap_events_writer
  from tensorflow.python.platform import gfile
  if any(name.endswith(EVENT_FILE_SUFFIX) for name in gfile.ListDirectory(logdir)):
    return
  writer = _pywrap_events_writer.EventsWriter(os.path.join(logdir, "events").encode())
  writer.InitWithSuffix(EVENT_FILE_SUFFIX.encode())
  writer.Close()


def save(logdir, result):
  """Writes stop()'s result under logdir/plugins/profile/<time>/local.trace."""
  from tensorflow.python.platform import gfile
  run_dir = os.path.join(logdir, "plugins", "profile",
                         datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
  gfile.MakeDirs(run_dir)
  maybe_create_event_file(logdir)
  with gfile.GFile(os.path.join(run_dir, "local.trace"), "wb") as f:
    f.write(result)


def start_profiler_server(port):
  """Starts the profiler's gRPC server on `port` (for capture_tpu_profile / TensorBoard)."""
  from tensorflow.python.eager import context
  from tensorflow.python.profiler.internal import _pywrap_profiler
  if context.default_execution_mode == context.EAGER_MODE:
    context.ensure_initialized()
  _pywrap_profiler.start_server(port)


class Profiler:
  """`with Profiler(logdir): ...` profiles the block and saves the trace under logdir."""

  def __init__(self, logdir):
    self._logdir = logdir

  def __enter__(self):
    start()

  def __exit__(self, typ, value, tb):
    save(self._logdir, stop())
