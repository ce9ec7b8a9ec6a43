"""Graceful preemption: SIGTERM or SIGINT ends the run after the step in flight, with a checkpoint.

Spot/preemptible VMs and TPU VMs send SIGTERM and allow ~30 s before they
kill. While a `Watch` is active, the signal only sets a flag; the hooks the
loop passes to every train() and evaluate() call act on it:

- training (`StopOnSignalHook`) asks the MonitoredSession to stop after the
  step (the iterations_per_loop loop, on a TPU and with --host_loop:
  engines/host_loop.py) in flight; the Estimator's own
  CheckpointSaverHook then saves at that step, as any run's end does, and
  tells `SavedListener` it has;
- evaluation (`StopEvaluationHook`) ends the evaluation in flight at once by
  raising `EvaluationStopped`: nothing of it is kept, not even the eval
  summary the Estimator would write for a finished one (the resumed run
  evaluates that step again).

The hooks run on the host on every platform: CPU, GPU, the tf.distribute path
and TPUEstimator with --use_tpu.

A command-line run gives the Watch an `on_stop` callback: each hook calls
`Watch.stopped()` at the first moment nothing more is needed to resume (the
checkpoint of the step in flight is saved; or nothing new was trained in this
call; or an evaluation is cut short), and the callback prints the line and
exits without the seconds of teardown a session and TensorFlow's threads take
(bench_preemption.py measures it). `interrupting()` makes a signal raise
`Preempted` at once, for work that may be abandoned (an export, staged and
removed on error).

A worker of a multi-worker run on the distribute engine must not stop alone:
its Watch (`hold=True`) holds a signal (`held`) instead of acting on it, and
the engine agrees with the other workers at its loop's edges
(engines/distribute/workers.py); every worker's watch is then `release`d with
the signal and stops as above, at the same step.

A second SIGINT (Ctrl-C twice) stops at once, as Python's default does.
The entry points then exit with cli.EXIT_RETRY (75), which schedulers read
as "run me again".
"""

import contextlib
import signal
import threading

import tensorflow as tf

SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXPORTING = "exporting"


class Preempted(Exception):
  """The run stopped on a signal; `step` is saved in `checkpoint` (None: nothing saved).

  `during` names work abandoned midway (EXPORTING), or is None.
  """

  def __init__(self, signal_name, step, checkpoint, during=None):
    super().__init__(f"{signal_name} at step {step}")
    self.signal_name = signal_name
    self.step = step
    self.checkpoint = checkpoint
    self.during = during


class EvaluationStopped(Exception):
  """An evaluation ended on a watched signal before its last step (nothing of it is kept)."""


class Watch:
  """Catches SIGTERM/SIGINT while active (a context manager); `signal_name` says which came.

  Signal handlers can only be set in the main thread; elsewhere (a test
  runner's worker thread) the watch is inactive and signals act as before.

  Args:
    signals: the signals to catch.
    on_stop: None, or `on_stop(signal_name, step)`, called by `stopped()`
      once a signal came; `step` is the global step just saved, or None when
      nothing was trained since the newest checkpoint. A command-line run
      exits there; returning lets the run stop the ordinary way.
    hold: a worker of a multi-worker run: a signal is `held` until the
      workers agree to stop (`release`); work abandoned midway
      (`interrupting`) still stops at once.
  """

  def __init__(self, signals=SIGNALS, on_stop=None, hold=False):
    self._signals = signals
    self._previous = {}
    self._on_stop = on_stop
    self._during = None
    self._hold = hold
    self.signal_name = None
    self.held = None

  @property
  def requested(self):
    return self.signal_name is not None

  def _handle(self, signum, unused_frame):
    if (self.requested or self.held) and signum == signal.SIGINT:
      signal.signal(signal.SIGINT, signal.default_int_handler)
      raise KeyboardInterrupt
    name = signal.Signals(signum).name
    if self._during is not None:
      self.signal_name = name
      raise Preempted(self.signal_name, None, None, during=self._during)
    if self._hold:
      self.held = self.held or name
      return
    self.signal_name = name

  def release(self, signal_name):
    """Every worker agreed to stop for signal_name: from now on as if it had come here."""
    self.signal_name = self.signal_name or signal_name

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

  @contextlib.contextmanager
  def interrupting(self, during):
    """A signal in the block raises Preempted(during=during) at once (one already come: now)."""
    if self.requested:
      raise Preempted(self.signal_name, None, None, during=during)
    self._during = during
    try:
      yield
    finally:
      self._during = None

  def stopped(self, step=None):
    """Hands over to on_stop if a signal came: nothing more is needed to resume."""
    if self.requested and self._on_stop is not None:
      self._on_stop(self.signal_name, step)

  def hook(self):
    return StopOnSignalHook(self)

  def eval_hook(self):
    return StopEvaluationHook(self)

  def listener(self):
    return SavedListener(self)


class StopOnSignalHook(tf.compat.v1.train.SessionRunHook):
  """Asks the session to stop after the run in which a watched signal arrived.

  Python runs the signal handler as soon as session.run returns, so the flag
  is set by the time after_run looks at it. A signal that came before the
  first step of this call (while the graph was built or the session made)
  needs no step: the newest checkpoint is where this call started.
  """

  def __init__(self, watch):
    self.watch = watch

  def begin(self):
    self.watch.stopped()

  def after_create_session(self, session, coord):
    del session, coord
    self.watch.stopped()

  def after_run(self, run_context, run_values):
    del run_values
    if self.watch.requested:
      run_context.request_stop()


class StopEvaluationHook(tf.compat.v1.train.SessionRunHook):
  """Ends an evaluation at once on a watched signal (see EvaluationStopped)."""

  def __init__(self, watch):
    self.watch = watch

  def begin(self):
    self._stop_if_requested()

  def after_run(self, run_context, run_values):
    del run_context, run_values
    self._stop_if_requested()

  def _stop_if_requested(self):
    if self.watch.requested:
      self.watch.stopped()
      raise EvaluationStopped(self.watch.signal_name)


class SavedListener(tf.compat.v1.train.CheckpointSaverListener):
  """Tells the watch when the checkpoint of a stopped training call is on disk.

  The CheckpointSaverHook calls end() right after its final save, whatever
  order the hooks run in (tf.distribute puts the user's hooks first).
  """

  def __init__(self, watch):
    self._watch = watch

  def end(self, session, global_step):
    del session
    self._watch.stopped(int(global_step))


def watches_of(hooks):
  """The Watches behind the preemption hooks among hooks (each once)."""
  watches = []
  for hook in hooks or ():
    watch = getattr(hook, "watch", None) if isinstance(
        hook, (StopOnSignalHook, StopEvaluationHook)) else None
    if watch is not None and all(watch is not w for w in watches):
      watches.append(watch)
  return watches
