"""The estimator's own training hooks, as the distribute engine applies them after each loop.

TPUEstimator's ExamplesPerSecondHook and LoggingTensorHook are driven here
with the values of a run (a session-shaped stand-in answers the global
step), and the engine's monitors with the same steps and losses: the same
lines, at the same steps.
"""

import contextlib
import logging
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.util import deprecation
from tensorflow_estimator.python.estimator.tpu import tpu_estimator as tf_tpu_estimator

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import monitors

LOSSES = [0.9, 0.7, 0.5, 0.4, 0.3, 0.2]  # one per call of the training function
STEPS_PER_LOOP = 2
BATCH = 8


@contextlib.contextmanager
def _tf_lines():
  """Collects the messages TensorFlow's logger gives at INFO and above (deprecations aside)."""
  lines = []
  handler = logging.Handler()
  handler.emit = lambda record: lines.append((record.levelname, record.getMessage()))
  logger = tf.get_logger()
  level = logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  try:
    with deprecation.silence():  # TF 1's SessionRunArgs and errors: what they say here is noise
      yield lines
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)


def _estimator(model_dir, log_step_count_steps):
  config = stacks.tpu.RunConfig(
      model_dir=model_dir, log_step_count_steps=log_step_count_steps, save_summary_steps=None,
      tpu_config=stacks.tpu.TPUConfig(iterations_per_loop=STEPS_PER_LOOP))
  return stacks.tpu.TPUEstimator(model_fn=lambda features, labels, mode, params: None,
                                 config=config, use_tpu=False, train_batch_size=BATCH)


class _Session:
  """What the hooks ask a session for: the global step after the run."""

  def __init__(self):
    self.step = 0

  def run(self, unused_fetches):
    return self.step


def _by_tpuestimators_hooks(estimator):
  """The lines of the hooks TPUEstimator runs on a TPU, one session.run per loop."""
  every = estimator._log_every_n_steps  # pylint: disable=protected-access
  with tf.Graph().as_default():
    tf.compat.v1.train.create_global_step()
    loss = tf.constant(0.0)
    step_tensor = tf.constant(0, tf.int64)
    rate = tf_tpu_estimator.ExamplesPerSecondHook(BATCH, every_n_steps=every)
    rate._set_steps_per_run(STEPS_PER_LOOP)  # pylint: disable=protected-access
    loss_log = tf.compat.v1.train.LoggingTensorHook({"loss": loss, "step": step_tensor},
                                                    every_n_iter=every)
    hooks = [loss_log, rate]
    for hook in hooks:
      hook.begin()
  session = _Session()
  context = tf.compat.v1.train.SessionRunContext(None, session)
  with _tf_lines() as lines:
    for value in LOSSES:
      stale = session.step
      for hook in hooks:
        hook.before_run(context)
      session.step += STEPS_PER_LOOP
      loss_log.after_run(context, tf.compat.v1.train.SessionRunValues(
          {"loss": np.float32(value), "step": np.int64(session.step)}, None, None))
      rate.after_run(context, tf.compat.v1.train.SessionRunValues(stale, None, None))
  return lines


def _by_the_engine(estimator, model_dir):
  watch = monitors.TrainingMonitors(model_dir, estimator, BATCH, on_tpu=True)
  with _tf_lines() as lines:
    for i, value in enumerate(LOSSES):
      watch.after_loop((i + 1) * STEPS_PER_LOOP, np.float32(value))
  return lines


def _masked(lines):
  return [(level, re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "N", text)) for level, text in lines]


def test_the_step_rate_and_the_tpu_loss_line_fall_where_the_estimators_hooks_put_them(tmp_path):
  estimator = _estimator(str(tmp_path), log_step_count_steps=4)  # every 2 loops of 2 steps
  expected = _by_tpuestimators_hooks(estimator)
  said = _by_the_engine(estimator, str(tmp_path))
  assert _masked(said) == _masked(expected)
  losses = [text for _, text in said if text.startswith("loss =")]
  assert [text.split(" (")[0] for text in losses] == [
      "loss = 0.9, step = 2", "loss = 0.5, step = 6", "loss = 0.3, step = 10"]
  # ceil(4 / 2) = every 2 steps: after each loop but the first, which starts the count.
  assert len([text for _, text in said if text.startswith("global_step/sec")]) == 5


def test_without_log_step_count_steps_the_engine_says_no_rate(tmp_path):
  said = _by_the_engine(_estimator(str(tmp_path), log_step_count_steps=None), str(tmp_path))
  assert said == []
