"""tf.contrib.tpu names that were fragile off TPU: CrossShardOptimizer, TPUEstimatorSpec.

Both behave exactly like their TF 2.15 homes inside a TPU computation and
forgive the legacy habits (wrapping the optimizer unconditionally, passing a
dict of metric ops) when the same model_fn runs on CPU or GPU.
"""

import tensorflow as tf
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer
from tensorflow.python.tpu import tpu_replication
from tensorflow_estimator.python.estimator.tpu import tpu_estimator

from estimator_tpu.compat import _util


def in_tpu_computation():
  """Whether ops built now belong to a TPU computation.

  TPUEstimator on TPU, `tpu.rewrite`, `tpu.replicate` and `tpu.shard` all
  build the computation inside `tpu_shard_context` (the test the real
  CrossShardOptimizer uses) and a `TPUReplicateContext` control-flow context;
  either one counts. TPUEstimator with use_tpu=False calls model_fn in
  neither.

  Returns:
    A Python bool.
  """
  if tpu_function.get_tpu_context().number_of_shards is not None:
    return True
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    context = graph._get_control_flow_context()
    while context is not None:
      if isinstance(context, tpu_replication.TPUReplicateContext):
        return True
      context = context.outer_context
    graph = getattr(graph, "outer_graph", None)
  return False


class CrossShardOptimizer(tpu_optimizer.CrossShardOptimizer):
  """tf.contrib.tpu.CrossShardOptimizer that is a no-op wrapper off TPU.

  Inside a TPU computation it is `tf.compat.v1.tpu.CrossShardOptimizer`
  (gradients summed with CrossReplicaSum). Outside one, TF 2.15's class still
  emits CrossReplicaSum, which has no CPU/GPU kernel ("No OpKernel was
  registered to support Op 'CrossReplicaSum'"); this one delegates to the
  wrapped optimizer instead and logs one INFO line.
  """

  def compute_gradients(self, loss, var_list=None, **kwargs):
    if in_tpu_computation():
      return super().compute_gradients(loss, var_list=var_list, **kwargs)
    self._warn_off_tpu()
    return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    if in_tpu_computation():
      return super().apply_gradients(grads_and_vars, global_step, name)
    self._warn_off_tpu()
    return self._opt.apply_gradients(grads_and_vars, global_step, name)

  def _warn_off_tpu(self):
    _util.note_once(
        "CrossShardOptimizer", "tf.contrib.tpu.CrossShardOptimizer is used "
        "outside a TPU computation: acting as the wrapped %s (no "
        "CrossReplicaSum).", type(self._opt).__name__)


class TPUEstimatorSpec(tpu_estimator.TPUEstimatorSpec):
  """tf.contrib.tpu.TPUEstimatorSpec that also accepts a dict of metric ops.

  `eval_metrics` is normally `(metric_fn, tensors)`. Legacy model_fns often
  pass `{'accuracy': tf.metrics.accuracy(...)}` (the `eval_metric_ops` shape
  of EstimatorSpec); off TPU that dict is wrapped into an argument-free
  metric_fn so evaluation works, on TPU it raises a ValueError saying to use
  `(metric_fn, tensors)`. Every other argument is TPUEstimatorSpec's.
  """

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metrics=None, export_outputs=None, scaffold_fn=None,
              host_call=None, training_hooks=None, evaluation_hooks=None,
              prediction_hooks=None):
    return super().__new__(
        cls, mode, predictions=predictions, loss=loss, train_op=train_op,
        eval_metrics=_as_metric_fn_tuple(eval_metrics),
        export_outputs=export_outputs, scaffold_fn=scaffold_fn,
        host_call=host_call, training_hooks=training_hooks,
        evaluation_hooks=evaluation_hooks, prediction_hooks=prediction_hooks)


def _as_metric_fn_tuple(eval_metrics):
  """Turns a dict of metric ops into `(metric_fn, [])`; off TPU only."""
  if not isinstance(eval_metrics, dict):
    return eval_metrics
  fns = sorted(name for name, value in eval_metrics.items()
               if isinstance(value, (tuple, list)) and value and callable(value[0]))
  if fns:
    raise ValueError(
        f"TPUEstimatorSpec(eval_metrics=<dict>): {fns} are (metric_fn, tensors) pairs, which "
        "TPUEstimatorSpec takes one of, not a dict: give eval_metrics=(metric_fn, tensors) "
        "whose metric_fn returns every metric's (value, update_op) in one dict")
  if in_tpu_computation():
    raise ValueError(
        f"TPUEstimatorSpec(eval_metrics=<dict with keys "
        f"{sorted(eval_metrics)}>) only works off TPU: metric ops cannot be "
        f"built inside the TPU computation. Pass "
        f"eval_metrics=(metric_fn, [labels, logits]) instead, where "
        f"metric_fn(labels, logits) returns that dict, e.g. "
        f"{{'accuracy': tf.metrics.accuracy(labels, tf.argmax(logits, 1))}}.")
  _util.note_once(
      "eval_metrics_dict", "TPUEstimatorSpec got eval_metrics as a dict of "
      "metric ops; accepted off TPU. On TPU pass (metric_fn, tensors).")
  metric_ops = dict(eval_metrics)
  return (lambda: metric_ops, [])
