"""Checkpoint hooks of TF 1 TPU code that current TensorFlow lost or broke.

- AsyncCheckpointSaverHook (tf.contrib.tpu): TF 2.15's saves from a thread
  outside the graph's context, fails there ("Can only save/restore
  ResourceVariables when executing eagerly") and the run still exits 0; TF 2.16
  removed it. This one writes the same files at the same cadence with the same
  listeners as CheckpointSaverHook, in the training thread.
- CheckpointInputPipelineHook (tf.data.experimental): saves the input
  iterators' positions beside the model checkpoints (`input.ckpt-N`, with its
  own `checkpoint_input` state file) and restores them when a run resumes;
  TF 2.16 removed it.
"""

import tensorflow as tf
from tensorflow.python.data.experimental.ops import iterator_ops as experimental_iterator_ops
from tensorflow.python.data.ops import iterator_ops


class AsyncCheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
  """tf.contrib.tpu.AsyncCheckpointSaverHook's signature; saves every checkpoint it is due.

  The save runs in the training thread: a background save cannot reach the
  graph's resource variables, and a checkpoint that silently fails to appear
  loses a preempted run's progress.
  """


class _InputSaver(tf.compat.v1.train.Saver):
  """A Saver whose state file is `checkpoint_input`, apart from the model's `checkpoint`."""

  def __init__(self, saveables, latest_filename):
    super().__init__(saveables, sharded=True)
    self._latest_filename = latest_filename

  def save(self, sess, save_path, global_step=None, latest_filename=None, **kwargs):
    return super().save(sess, save_path, global_step=global_step,
                        latest_filename=latest_filename or self._latest_filename, **kwargs)


class CheckpointInputPipelineHook(tf.compat.v1.train.SessionRunHook):
  """Saves and restores the input pipeline's position with the estimator's checkpoints.

  Args:
    estimator: the Estimator whose model_dir and checkpoint cadence to follow.
    external_state_policy: 'fail' (default), 'warn' or 'ignore': what to do
      with iterator state that cannot be saved (e.g. a Python generator).
  """

  def __init__(self, estimator, external_state_policy=None):
    config = estimator.config
    self._policy = experimental_iterator_ops._convert_external_state_policy_to_enum(
        external_state_policy or "fail")
    prefix = "input"
    if config.num_worker_replicas > 1:
      prefix += f"_{config.task_type}_{config.task_id}"
    self._latest_filename = "checkpoint_" + prefix
    self._saver_hook = tf.compat.v1.train.CheckpointSaverHook(
        estimator.model_dir, save_secs=config.save_checkpoints_secs,
        save_steps=config.save_checkpoints_steps, checkpoint_basename=prefix + ".ckpt")
    self._first_run = True

  def begin(self):
    iterators = tf.compat.v1.get_collection(iterator_ops.GLOBAL_ITERATORS)
    saveables = [iterator_ops._IteratorSaveable(
        iterator, iterator.name, external_state_policy=self._policy) for iterator in iterators]
    self._saver_hook._saver = _InputSaver(saveables, self._latest_filename)
    self._saver_hook.begin()

  def after_create_session(self, session, coord):
    self._first_run = True

  def before_run(self, run_context):
    if self._first_run:
      self._first_run = False
      self._restore_or_save(run_context.session)
    return self._saver_hook.before_run(run_context)

  def after_run(self, run_context, run_values):
    self._saver_hook.after_run(run_context, run_values)

  def end(self, session):
    self._saver_hook.end(session)

  def _restore_or_save(self, session):
    """Resumes the iterators from the newest input checkpoint, or saves the first one."""
    hook = self._saver_hook
    latest = tf.train.latest_checkpoint(hook._checkpoint_dir, latest_filename=self._latest_filename)
    if latest:
      hook._get_saver().restore(session, latest)
      return
    step = session.run(hook._global_step_tensor)
    hook._save(session, step)
    hook._timer.update_last_triggered_step(step)
