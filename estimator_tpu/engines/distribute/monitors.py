"""What TPUEstimator's own training hooks do, done by the distribute engine after each loop.

TPUEstimator's train() runs, besides a program's hooks, hooks of its own:
SummarySaverHook (`loss` every save_summary_steps, a START SessionLog),
ExamplesPerSecondHook (`global_step/sec` and `examples/sec`, logged and
written, every ceil(log_step_count_steps / iterations_per_loop) steps) and,
on a TPU, a LoggingTensorHook (`loss = X, step = N`). Their rules are kept
here with TensorFlow's own timer (SecondOrStepTimer), applied once per call
of the training function: one session.run of TPUEstimator on a TPU, one
step on CPU/GPU (so with iterations_per_loop=1 every line and event falls
where the estimator's does on CPU; with more, at the loop ends, as on a
TPU). The SummarySaverHook runs before the program's hooks (`summaries`),
the others after them (`after_loop`), as in the Estimator's order of hooks.
The Estimator's NanTensorHook is a hook among the program's (hooks.py).
"""

import tensorflow as tf

from estimator_tpu.engines.distribute import event_files
from estimator_tpu.engines.distribute import voice

_Timer = tf.compat.v1.train.SecondOrStepTimer


class TrainingMonitors:
  """The estimator's own hooks for one train() call.

  Args:
    model_dir: where the training events go.
    estimator: the TPUEstimator whose settings apply (its config's
      save_summary_steps, its log_step_count_steps over iterations_per_loop),
      or None for none of them.
    global_batch_size: examples per step, over all replicas.
    on_tpu: whether TPUEstimator would run on a TPU (it then logs the loss).
  """

  def __init__(self, model_dir, estimator, global_batch_size, on_tpu):
    self._model_dir = model_dir
    self._batch = global_batch_size
    config = estimator.config if estimator is not None else None
    summary_steps = config.save_summary_steps if config is not None else None
    # TPUEstimator's own reckoning of log_step_count_steps (over iterations_per_loop).
    every_steps = getattr(estimator, "_log_every_n_steps", None)
    every_secs = getattr(estimator, "_log_every_n_secs", None)
    self._summaries = _Timer(every_steps=summary_steps) if summary_steps else None
    self._next_step = None
    logging = every_steps is not None or every_secs is not None
    self._rate = _Timer(every_secs=every_secs, every_steps=every_steps) if logging else None
    self._rate_events = config is None or bool(summary_steps)
    self._loss_log = _Timer(every_secs=every_secs, every_steps=every_steps) if (
        logging and on_tpu) else None
    self._loops = 0

  def after_loop(self, step, loss):
    """The step rate and (on a TPU) the loss line, once the hooks saw the call's steps."""
    self._log_loss(step, loss)
    self._log_rate(step)
    self._loops += 1

  def end(self):
    event_files.flush(self._model_dir)

  def summaries(self, step, loss):
    """SummarySaverHook after a call that ended at `step`: START at its first, `loss` when due."""
    if self._summaries is None:
      return
    requested = self._next_step is None or self._summaries.should_trigger_for_step(
        self._next_step)
    if self._next_step is None:
      event_files.session_started(self._model_dir, step)
    if requested:
      self._summaries.update_last_triggered_step(step)
      event_files.scalars(self._model_dir, {"loss": loss}, step)
    self._next_step = step + 1

  def _log_loss(self, step, loss):
    """LoggingTensorHook({'loss', 'step'}): counts calls, as it counts session runs."""
    if self._loss_log is None or not self._loss_log.should_trigger_for_step(self._loops):
      return
    elapsed, _ = self._loss_log.update_last_triggered_step(self._loops)
    voice.loss_and_step(loss, step, elapsed)

  def _log_rate(self, step):
    """ExamplesPerSecondHook: steps and examples per second since it last said them."""
    if self._rate is None or not self._rate.should_trigger_for_step(step):
      return
    elapsed_time, elapsed_steps = self._rate.update_last_triggered_step(step)
    if elapsed_time is None:
      return
    steps_per_sec = elapsed_steps / elapsed_time
    examples_per_sec = self._batch * steps_per_sec
    if self._rate_events:  # two events, as the hook writes them
      event_files.scalars(self._model_dir, {"global_step/sec": steps_per_sec}, step)
      event_files.scalars(self._model_dir, {"examples/sec": examples_per_sec}, step)
    voice.step_rate(steps_per_sec, examples_per_sec)
