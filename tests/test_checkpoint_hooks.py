"""compat's AsyncCheckpointSaverHook and CheckpointInputPipelineHook, with checkpoints read back."""

import os

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.compat import tf as compat_tf


def _steps_in(model_dir, state_file="checkpoint"):
  state = tf.train.get_checkpoint_state(model_dir, latest_filename=state_file)
  return sorted(int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths)


def test_async_checkpoint_saver_hook_writes_every_due_checkpoint(tmp_path):
  saved = []

  class Listener(tf.compat.v1.train.CheckpointSaverListener):
    def after_save(self, session, global_step_value):
      saved.append(global_step_value)

  hook = compat_tf.contrib.tpu.AsyncCheckpointSaverHook(
      str(tmp_path), save_steps=2, listeners=[Listener()])
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    weight = tf.compat.v1.get_variable("w", initializer=1.0)
    train_op = tf.group(step.assign_add(1), weight.assign_add(0.5))
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as session:
      for _ in range(5):
        session.run(train_op)
  assert saved == [0, 2, 4, 5]
  assert _steps_in(str(tmp_path)) == [0, 2, 4, 5]
  newest = tf.train.latest_checkpoint(str(tmp_path))
  assert tf.train.load_variable(newest, "w") == 1.0 + 5 * 0.5


def _model_fn(features, labels, mode):
  del labels
  seen = tf.compat.v1.get_variable("seen", initializer=tf.constant(-1, tf.int64))
  step = tf.compat.v1.train.get_or_create_global_step()
  train_op = tf.group(seen.assign(features[0]), step.assign_add(1))
  return stacks.estimator.EstimatorSpec(mode, loss=tf.constant(0.0), train_op=train_op)


def _input_fn():
  return tf.data.Dataset.range(100).batch(1)


def test_checkpoint_input_pipeline_hook_resumes_where_the_input_stopped(tmp_path):
  config = stacks.estimator.RunConfig(model_dir=str(tmp_path), save_checkpoints_steps=2)
  estimator = stacks.estimator.Estimator(_model_fn, config=config)
  hook = compat_tf.contrib.data.CheckpointInputPipelineHook(estimator)
  estimator.train(_input_fn, hooks=[hook], max_steps=3)
  assert os.path.exists(os.path.join(str(tmp_path), "checkpoint_input"))
  assert _steps_in(str(tmp_path), "checkpoint_input")[-1] == 3
  assert estimator.get_variable_value("seen") == 2  # elements 0, 1, 2
  hook = compat_tf.contrib.data.CheckpointInputPipelineHook(estimator)
  estimator.train(_input_fn, hooks=[hook], max_steps=5)
  # Resumed at element 3, not at 0: steps 4 and 5 read elements 3 and 4.
  assert estimator.get_variable_value("seen") == 4
