"""Training's progress line: step / total, loss, images/s and time left, as the steps run.

A SessionRunHook asks for the global step and the loss the TF 1 way
(SessionRunArgs from before_run, as LoggingTensorHook), and only when the line
is due (a redraw on a terminal, else a plain line every
ESTIMATOR_TPU_PROGRESS_SECS): other steps run with no extra fetch. The loss is
the last of the LOSSES collection, where the Estimator puts the model_fn's
loss; with a session, the step is read again after the run (as
StepCounterHook does), since one run may take several steps (a TPU's
iterations_per_loop) and a fetch races the step's own increment. An engine
that runs hooks without a session serves the fetches from its own values; one
that serves none (results None) leaves the line to the loop, which moves it
once per train() call.
"""

import tensorflow as tf

from estimator_tpu import progress


def plain_line(done, total, secs_left, details):
  """`step 120/800 | loss 0.5120 | 1234 img/s | 2m10s left`."""
  parts = [f"step {done}/{total}", details]
  if secs_left is not None:
    parts.append(f"{progress.duration(secs_left)} left")
  return " | ".join(part for part in parts if part)


class TrainProgress:
  """The run's training progress, across its train() calls (one per evaluation).

  Args:
    total_steps: --train_steps.
    batch_size: the global training batch (images per step).
    start_step: the step the run starts (or resumes) at.
    say: prints a plain line (loop.say).
  """

  def __init__(self, total_steps, batch_size, start_step, say):
    self._batch_size = batch_size
    self._progress = progress.Progress(
        total_steps, "steps",
        lambda done, total, rate, left, details: plain_line(done, total, left, details),
        initial=start_step, say=say)

  def update(self, step, loss=None):
    """The run is at `step`; loss: that step's, when known."""
    details = [] if loss is None else [f"loss {float(loss):.4f}"]
    rate = self._progress.rate()
    if rate > 0:
      details.append(f"{rate * self._batch_size:.0f} img/s")
    self._progress.update(step, " | ".join(details))

  def due(self):
    """Whether an update now would show something."""
    return self._progress.due()

  def hook(self):
    """A SessionRunHook that updates this progress after a session.run when a line is due."""
    return _ProgressHook(self)

  def close(self):
    self._progress.close()


class _ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Hands the global step and loss to a TrainProgress, fetched when its line is due."""

  def __init__(self, train_progress):
    self._progress = train_progress
    self._fetches = None

  def begin(self):
    step = tf.compat.v1.train.get_global_step()
    losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
    self._fetches = {"step": step} if step is not None else {}
    if losses:
      self._fetches["loss"] = losses[-1]

  def before_run(self, run_context):
    del run_context
    if "step" not in self._fetches or not self._progress.due():
      return None  # no global step (the loop moves the line per train() call), or not due
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    results = run_values.results
    if not results or results.get("step") is None:
      return
    step = results["step"]
    if run_context.session is not None:
      step = run_context.session.run(self._fetches["step"])
    self._progress.update(int(step), results.get("loss"))
