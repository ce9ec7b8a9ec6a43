"""The estimator's INFO lines, said by the distribute engine where TPUEstimator says them.

Each line is TF 2.15's own text, from the module that says it on the
estimator: estimator.py (model_fn, training's end, evaluation's dict),
tpu_estimator.py (`Running train on CPU/GPU`), error_handling.py
(`training_loop marked as finished`), basic_session_run_hooks.py
(checkpoints), monitored_session.py / session_manager.py / saver.py (the
session's start) and evaluation.py (`Starting evaluation at ...`). They go
through tf.compat.v1.logging, so a program's own
`tf.logging.set_verbosity(tf.logging.INFO)` shows them, and TensorFlow's
default verbosity (WARN) hides them, as it hides the estimator's.
"""

import contextlib
import math
import time

import tensorflow as tf

_logging = tf.compat.v1.logging


def info(message, *args):
  _logging.info(message, *args)


@contextlib.contextmanager
def calling_model_fn(mode, on_tpu=False):
  """Around the model_fn's trace (one set of lines however many replicas call it)."""
  info("Calling model_fn.")
  if not on_tpu:
    info("Running %s on CPU/GPU", mode)
  yield
  info("Done calling model_fn.")


@contextlib.contextmanager
def loop_of(name):
  """TPUEstimator's train / evaluate / predict around the Estimator's: the loop's last words.

  Args:
    name: 'training_loop', 'evaluation_loop' or 'prediction_loop'.
  """
  failed = False
  try:
    yield
  except Exception:  # pylint: disable=broad-except
    failed = True
    raise
  finally:
    info("%s marked as finished", name)
    if failed:
      _logging.warning("Reraising captured error")


@contextlib.contextmanager
def session_creation():
  """What the estimator says as its session starts; the restore in between says its own line."""
  info("Graph was finalized.")
  yield
  info("Running local_init_op.")
  info("Done running local_init_op.")


def restoring(checkpoint_path):
  info("Restoring parameters from %s", checkpoint_path)


def no_trained_model(model_dir, what):
  """evaluate / predict without a checkpoint: they run from the initial values."""
  info(f"Could not find trained model in model_dir: {model_dir}, running initialization to "
       f"{what}.")


# Training.


def skipping_training():
  info("Skipping training since max_steps has already saved.")


def create_checkpoint_saver():
  info("Create CheckpointSaverHook.")


def before_save(step):
  info("Calling checkpoint listeners before saving checkpoint %d...", step)


def saving(step, save_path):
  info("Saving checkpoints for %d into %s.", step, save_path)


def after_save(step):
  info("Calling checkpoint listeners after saving checkpoint %d...", step)


def listener_stopped(listener):
  info(f"A CheckpointSaverListener requested that training be stopped. listener: {listener}")


def step_rate(steps_per_sec, examples_per_sec):
  """ExamplesPerSecondHook's two lines."""
  info("global_step/sec: %g", steps_per_sec)
  info("examples/sec: %g", examples_per_sec)


def loss_and_step(loss, step, elapsed_secs):
  """LoggingTensorHook's line for {'loss', 'step'} (TPUEstimator logs it on a TPU)."""
  text = f"loss = {loss!s}, step = {step!s}"  # a NumPy scalar's str, as the hook's %s
  if elapsed_secs is None:
    info("%s", text)
  else:
    info("%s (%.3f sec)", text, elapsed_secs)


def no_steps():
  _logging.warning("Training with estimator made no steps. Perhaps input is empty or "
                   "misspecified.")


def loss_for_final_step(loss):
  info("Loss for final step: %s.", loss)


# Evaluation.


def starting_evaluation():
  """Returns the start time, for finished_evaluation."""
  info("Starting evaluation at " + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()))
  return time.time()


def evaluation_steps(steps):
  """The estimator's hooks of evaluate(steps): none, or one that says and stops after `steps`."""
  return [] if steps is None else [_StopAfterNEvals(steps)]


class _StopAfterNEvals(tf.compat.v1.train.SessionRunHook):
  """evaluation._StopAfterNEvalsHook: says `Evaluation [i/n]`, and stops after the n-th step.

  It says it after every step (every n / 10 steps when n >= 20) and after the last.
  """

  def __init__(self, num_evals):
    self._num_evals = num_evals
    self._every = 1 if num_evals < 20 else math.floor(num_evals / 10.)
    self._done = 0

  def after_run(self, run_context, run_values):
    del run_values  # the estimator's eval step counts the runs: so does this hook
    self._done += 1
    if self._done % self._every == 0 or self._done == self._num_evals:
      info("Evaluation [%d/%d]", self._done, self._num_evals)
    if self._done >= self._num_evals:
      run_context.request_stop()


def finished_evaluation(started):
  info("Inference Time : {:0.5f}s".format(time.time() - started))
  info("Finished evaluation at " + time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime()))
