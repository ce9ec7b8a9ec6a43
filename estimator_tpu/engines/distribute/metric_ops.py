"""eval_metric_ops of an EstimatorSpec on the engine: updated every step, read once at the end.

An EstimatorSpec's `eval_metric_ops` are `(value, update_op)` pairs built in
the model_fn (tf.compat.v1.metrics.*, slim's streaming metrics, a program's
own pairs). The Estimator runs every update_op on every batch and reads the
values once, after the last batch (its FinalOpsHook). On the engine the
update ops run in each evaluation step (a tf.function runs its stateful
ops); the values are read at the end from the step's graph, pruned to them
(pruning.py), so they read the metric variables without updating them.

Under a strategy each replica updates its own copy of the metric variables
(TF 1 metrics make them ON_READ with SUM aggregation) and a value reads
their sum across replicas (metrics_impl's merge_call): the same value as on
one device over the same records. `LocalVariables` sets them back to their
initial values when an evaluation (or a training or prediction run) starts,
as the Estimator's local_init_op does in each new session.
"""

import tensorflow as tf

from estimator_tpu.engines.distribute import pruning

_RESERVED = ("loss", tf.compat.v1.GraphKeys.GLOBAL_STEP)


def value_tensors(spec):
  """{name: value tensor} of spec.eval_metric_ops; the Estimator's reserved names refused."""
  metric_ops = getattr(spec, "eval_metric_ops", None) or {}
  for name in _RESERVED:
    if name in metric_ops:
      raise ValueError(f"Metric with name `{name}` is not allowed, because Estimator already "
                       "defines a default metric with the same name.")
  values = {}
  for name, pair in metric_ops.items():
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise TypeError(f"eval_metric_ops[{name!r}] is a {type(pair).__name__}; give a "
                      "(value, update_op) pair, e.g. tf.compat.v1.metrics.mean(...)")
    values[name] = pair[0]
  return values


def final_values(trace):
  """{name: numpy value} of the metrics of trace's spec, read from their variables now.

  Raises:
    ValueError: a value op that reads the input batch (not only its
      variables), which the Estimator's FinalOpsHook would also fail on.
  """
  values = value_tensors(trace.spec)
  if not values:
    return {}
  names = sorted(values)
  try:
    pruned = pruning.Pruned(trace.graph, [values[name] for name in names])
  except pruning.NeedsStepInputsError as error:
    raise ValueError(f"an eval_metric_ops value depends on the input batch ({error}); a "
                     "metric's value op must read only its variables, its update_op reads the "
                     "batch") from None
  return dict(zip(names, pruned()))


class LocalVariables:
  """The engine's local variables (metrics' state), put back to their initial values on demand."""

  def __init__(self):
    self._initial = {}

  def snapshot(self, store, strategy):
    """Records the value of each local variable not seen before (call right after a trace)."""
    for name in store.local_names:
      if name not in self._initial:
        copies = strategy.experimental_local_results(store.variables[name])
        self._initial[name] = [copy.read_value().numpy() for copy in copies]

  def reset(self, store, strategy):
    """Every replica's copy of every local variable back to its initial value."""
    for name, values in self._initial.items():
      copies = strategy.experimental_local_results(store.variables[name])
      for copy, value in zip(copies, values):
        copy.assign(value)
