"""Graceful preemption: SIGTERM or SIGINT ends the run after the step in flight, with a checkpoint.

Spot/preemptible VMs and TPU VMs send SIGTERM and allow ~30 s before they
kill. While a `Watch` is active, the signal only sets a flag; a SessionRunHook
(StopOnSignalHook) passed to every train() and evaluate() call asks the
MonitoredSession to stop after the step (on a TPU: the iterations_per_loop
loop) in flight, and the Estimator's own CheckpointSaverHook then saves at that
step as any run's end does. The hooks run on the host on every platform: CPU,
GPU, the tf.distribute path and TPUEstimator with --use_tpu.

A second SIGINT (Ctrl-C twice) stops at once, as Python's default does.
The entry points then exit with cli.EXIT_RETRY (75), which schedulers read
as "run me again".
"""

import signal
import threading

import tensorflow as tf

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """The run stopped on a signal; `step` is saved in `checkpoint` (None: nothing saved)."""

  def __init__(self, signal_name, step, checkpoint):
    super().__init__(f"{signal_name} at step {step}")
    self.signal_name = signal_name
    self.step = step
    self.checkpoint = checkpoint


class Watch:
  """Catches SIGTERM/SIGINT while active (a context manager); `signal_name` says which came.

  Signal handlers can only be set in the main thread; elsewhere (a test
  runner's worker thread) the watch is inactive and signals act as before.
  """

  def __init__(self, signals=SIGNALS):
    self._signals = signals
    self._previous = {}
    self.signal_name = None

  @property
  def requested(self):
    return self.signal_name is not None

  def _handle(self, signum, unused_frame):
    if self.requested and signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      raise KeyboardInterrupt
    self.signal_name = signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in self._signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *unused_exc_info):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}
    return False

  def hook(self):
    return StopOnSignalHook(self)


class StopOnSignalHook(tf.compat.v1.train.SessionRunHook):
  """Asks the session to stop after the run in which a watched signal arrived.

  Python runs the signal handler as soon as session.run returns, so the flag
  is set by the time after_run looks at it.
  """

  def __init__(self, watch):
    self._watch = watch

  def after_run(self, run_context, run_values):
    del run_values
    if self._watch.requested:
      run_context.request_stop()
