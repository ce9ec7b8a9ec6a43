"""tf.contrib.training's eval loop over checkpoints: evaluate_repeatedly and SummaryAtEndHook.

TF 2 kept checkpoints_iterator, wait_for_new_checkpoint and the one-checkpoint
evaluation (registry maps those); it dropped these two, which TF 1 eval jobs
ran beside a training job ("evaluate every new checkpoint until training ends").
"""

import tensorflow as tf
from tensorflow.python.training import evaluation as tf_evaluation

_V1 = tf.compat.v1


def _with_eval_step_update(eval_ops, update_eval_step):
  """eval_ops plus the op that counts one evaluation step, in eval_ops' own structure."""
  if isinstance(eval_ops, dict):
    return dict(eval_ops, update_eval_step=update_eval_step)
  if isinstance(eval_ops, (tuple, list)):
    return list(eval_ops) + [update_eval_step]
  return [eval_ops, update_eval_step]


def evaluate_repeatedly(checkpoint_dir, master="", scaffold=None, eval_ops=None,
                        feed_dict=None, final_ops=None, final_ops_feed_dict=None,
                        eval_interval_secs=60, hooks=None, config=None,
                        max_number_of_evaluations=None, timeout=None, timeout_fn=None):
  """Evaluates each new checkpoint in `checkpoint_dir` as it appears (TF 1.15's contract).

  Build the evaluation graph first (in the default graph); then for every
  checkpoint tf.train.checkpoints_iterator yields, a MonitoredSession restores
  it and runs `eval_ops` until a hook asks to stop (a StopAfterNEvalsHook
  counts the runs through the eval step; without one, until the input ends).

  Args:
    checkpoint_dir: directory the training job writes checkpoints to.
    master: the session target.
    scaffold: a tf.train.Scaffold (init and ready ops, saver), or None.
    eval_ops: an op, list or dict of ops run once per evaluation step, or None.
    feed_dict: fed with each run of eval_ops.
    final_ops: tensors evaluated once at the end of each evaluation.
    final_ops_feed_dict: fed with final_ops.
    eval_interval_secs: at least this long between two evaluations' starts.
    hooks: SessionRunHooks for each evaluation's session.
    config: a tf.ConfigProto for the sessions.
    max_number_of_evaluations: stop after this many evaluations (None: no limit).
    timeout: seconds to wait for a new checkpoint before calling timeout_fn.
    timeout_fn: called on timeout; the loop ends when it returns True (or
      when there is none).

  Returns:
    The value of `final_ops` from the last evaluation (None without final_ops
    or when no checkpoint appeared).
  """
  eval_step = tf_evaluation._get_or_create_eval_step()
  hooks = list(hooks or [])
  if eval_ops is not None:
    update_eval_step = _V1.assign_add(eval_step, 1)
    for hook in hooks:
      if isinstance(hook, tf_evaluation._StopAfterNEvalsHook):
        hook._set_evals_completed_tensor(update_eval_step)
    eval_ops = _with_eval_step_update(eval_ops, update_eval_step)
  final_ops_hook = _V1.train.FinalOpsHook(final_ops, final_ops_feed_dict)
  hooks.append(final_ops_hook)
  evaluations = 0
  for checkpoint_path in _V1.train.checkpoints_iterator(
      checkpoint_dir, min_interval_secs=eval_interval_secs, timeout=timeout,
      timeout_fn=timeout_fn):
    session_creator = _V1.train.ChiefSessionCreator(
        scaffold=scaffold, checkpoint_filename_with_path=checkpoint_path, master=master,
        config=config)
    with _V1.train.MonitoredSession(session_creator=session_creator, hooks=hooks) as session:
      _V1.logging.info("Evaluating %s", checkpoint_path)
      if eval_ops is not None:
        while not session.should_stop():
          session.run(eval_ops, feed_dict)
    evaluations += 1
    if max_number_of_evaluations is not None and evaluations >= max_number_of_evaluations:
      break
  return final_ops_hook.final_ops_values


class SummaryAtEndHook(_V1.train.SessionRunHook):
  """Writes summaries once when an evaluation's session ends, at its global step.

  Args:
    log_dir: where to write events (a FileWriter from the cache), unless
      summary_writer is given.
    summary_writer: a tf.summary.FileWriter to use instead.
    summary_op: the serialized Summary to write; default: all summaries
      merged (tf.summary.merge_all) when the session begins.
    feed_dict: fed when running summary_op.

  Raises:
    ValueError: neither log_dir nor summary_writer.
  """

  def __init__(self, log_dir=None, summary_writer=None, summary_op=None, feed_dict=None):
    if log_dir is None and summary_writer is None:
      raise ValueError("SummaryAtEndHook needs log_dir or summary_writer: where should the "
                       "summaries go?")
    self._log_dir = log_dir
    self._summary_writer = summary_writer
    self._summary_op = summary_op
    self._feed_dict = feed_dict

  def begin(self):
    if self._summary_writer is None:
      self._summary_writer = _V1.summary.FileWriterCache.get(self._log_dir)
    if self._summary_op is None:
      self._summary_op = _V1.summary.merge_all()
    self._global_step = _V1.train.get_or_create_global_step()

  def end(self, session):
    global_step = int(session.run(self._global_step))
    if self._summary_op is not None:
      summary = session.run(self._summary_op, self._feed_dict)
      self._summary_writer.add_summary(summary, global_step)
    self._summary_writer.flush()
