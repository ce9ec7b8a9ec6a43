"""The estimator's event files, written by the distribute engine: one TF 1 FileWriter per directory.

The estimator's hooks (CheckpointSaverHook, SummarySaverHook, the step
counter) and its evaluation share one `tf.compat.v1.summary.FileWriter` per
directory through `FileWriterCache`: one `events.out.tfevents.TIME.HOST` file
in model_dir and one in each eval dir, with `simple_value` scalars and
SessionLog events. The engine writes through the same cache, so its files,
tags and steps are the estimator's; its evaluation dict and checkpoint path
are written by the estimator's own functions. The engine has no TF 1 graph of
the model, so its writers are made without one (no graph_def events).
"""

import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib

_FileWriterCache = tf.compat.v1.summary.FileWriterCache
_SessionLog = tf.compat.v1.SessionLog


def writer(logdir):
  """The FileWriter of logdir that every writer in this process shares, made without a graph."""
  # FileWriterCache.get makes its writer with the default graph, which a
  # FileWriter refuses under eager execution: the engine's goes in first.
  with _FileWriterCache._lock:  # pylint: disable=protected-access
    cache = _FileWriterCache._cache  # pylint: disable=protected-access
    if logdir not in cache:
      with tf.Graph().as_default():
        cache[logdir] = tf.compat.v1.summary.FileWriter(logdir)
  return _FileWriterCache.get(logdir)


def scalars(logdir, values, step):
  """{tag: number} as simple_value scalars at step, as the estimator's hooks write them."""
  summary = tf.compat.v1.Summary(value=[
      tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))
      for tag, value in values.items()])
  writer(logdir).add_summary(summary, step)


def checkpoint_saved(logdir, save_path, step):
  """CheckpointSaverHook's SessionLog after each save."""
  writer(logdir).add_session_log(
      _SessionLog(status=_SessionLog.CHECKPOINT, checkpoint_path=save_path), step)


def session_started(logdir, step):
  """SummarySaverHook's SessionLog at the first step it sees."""
  writer(logdir).add_session_log(_SessionLog(status=_SessionLog.START), step)


def flush(logdir):
  writer(logdir).flush()


def evaluation(eval_dir, results, checkpoint_path):
  """The evaluation's dict and checkpoint path, by the estimator's own functions (and lines)."""
  writer(eval_dir)
  step = results["global_step"]
  estimator_lib._write_dict_to_summary(eval_dir, results, step)  # pylint: disable=protected-access
  if checkpoint_path:
    estimator_lib._write_checkpoint_path_to_summary(  # pylint: disable=protected-access
        eval_dir, checkpoint_path, step)
