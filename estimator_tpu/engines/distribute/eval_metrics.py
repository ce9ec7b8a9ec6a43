"""Where an eval_metrics metric_fn runs: on the host over its tensors, or in the step (off TPU).

TPUEstimator on a TPU sends `eval_metrics=(metric_fn, tensors)`'s tensors to
the host and calls metric_fn there, on the replicas' tensors concatenated;
the engine does the same (engine._HostMetrics). With use_tpu=False,
TPUEstimator calls metric_fn inside the model_fn's own graph
(`TPUEstimatorSpec.as_estimator_spec`), so a metric_fn that reads tensors of
the model_fn it was not given (a closure, or the compat TPUEstimatorSpec's
dict of `(value, update_op)` pairs) evaluates there and could not on the
host. Off TPU the engine tries metric_fn in a graph of its own first: where
it reads nothing but its arguments, it runs on the host as on a TPU; where it
reads more, it runs in the evaluation step, as TPUEstimator runs it off TPU,
and its `(value, update_op)` pairs are the step's eval_metric_ops
(metric_ops.py: each replica updates its own copy, the values are exact).
"""

import inspect

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from estimator_tpu import stacks

_VARIABLE_ARGS = frozenset(
    inspect.signature(resource_variable_ops.ResourceVariable.__init__).parameters) - {"self"}


def call_metric_fn(metric_fn, tensors):
  """metric_fn on tensors as TPUEstimator calls it: keyword arguments of a dict, else positional."""
  return metric_fn(**tensors) if isinstance(tensors, dict) else metric_fn(*tensors)


def reads_beyond_its_arguments(metric_fn, tensors):
  """Whether metric_fn reads tensors other than `tensors` (it cannot run on the host then).

  metric_fn is called in an empty graph on placeholders of the same shapes:
  it fails there, or returns tensors of another graph, when it reads the
  model_fn's own tensors.
  """
  graph = tf.Graph()
  with graph.as_default(), tf.variable_creator_scope(_in_this_graph):
    fed = tf.nest.map_structure(
        lambda t: tf.compat.v1.placeholder(t.dtype, t.shape) if tf.is_tensor(t) else t, tensors)
    try:
      result = call_metric_fn(metric_fn, fed)
    except Exception:  # noqa: BLE001 -- any failure there: it needs the model_fn's graph
      return True
  return any(getattr(x, "graph", graph) is not graph for x in tf.nest.flatten(result))


def _in_this_graph(next_creator, **kwargs):
  """A variable of the graph being built, made past every creator (the engine's, the strategy's)."""
  del next_creator
  return resource_variable_ops.ResourceVariable(
      **{k: v for k, v in kwargs.items() if k in _VARIABLE_ARGS})


class SpecWithMetricOps:
  """A model_fn's spec whose eval_metrics ran in the step: their pairs are its eval_metric_ops.

  Every other attribute is the spec's; eval_metrics is None, as nothing is
  left for the host.
  """

  eval_metrics = None

  def __init__(self, spec, eval_metric_ops):
    self._spec = spec
    self.eval_metric_ops = eval_metric_ops

  def __getattr__(self, name):
    return getattr(self._spec, name)


def in_the_step_off_tpu(spec, mode, use_tpu):
  """spec, or (off TPU, for a metric_fn that reads the model_fn's tensors) its SpecWithMetricOps.

  Call in the replica's trace, right after the model_fn.
  """
  metrics = getattr(spec, "eval_metrics", None)
  if use_tpu or mode != stacks.ModeKeys.EVAL or not metrics:
    return spec
  metric_fn, tensors = metrics
  if not reads_beyond_its_arguments(metric_fn, tensors):
    return spec
  return SpecWithMetricOps(spec, dict(call_metric_fn(metric_fn, tensors)))
