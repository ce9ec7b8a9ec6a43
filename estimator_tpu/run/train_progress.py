"""Training's progress line: step / total, loss, images/s and time left, as the steps run.

A SessionRunHook reads the global step and the loss at each session.run (the
loss the Estimator already fetches: the last of the LOSSES collection, where
it puts the model_fn's loss). The distribute engine runs hooks without a
session, so there the line moves once per train() call, from the loop.
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

  def hook(self):
    """A SessionRunHook that updates this progress at every session.run."""
    return _ProgressHook(self)

  def close(self):
    self._progress.close()


class _ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Hands each session.run's global step and loss to a TrainProgress."""

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
    if run_context.session is None or "step" not in self._fetches:
      return None  # the distribute engine: no tensors to fetch (its loop reports per call)
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    results = run_values.results
    if results:
      self._progress.update(int(results["step"]), results.get("loss"))
