"""A user's own model_fn (--model_fn=package.module:function), wrapped to count eval examples."""

import importlib

from tensorflow.python.util import function_utils

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.data import schema
from estimator_tpu.model import metrics
from estimator_tpu.model import model_fn as model_fn_lib

COUNT_METRIC = "num_eval_examples"
_WEIGHT_TENSOR = "estimator_tpu_eval_weight"


def _count_metric_fn(metric_fn, tensors, weights):
  """(metric_fn', tensors') that also report num_eval_examples from the weights."""

  def counting_metric_fn(*args, **kwargs):
    if isinstance(tensors, dict):
      batch_weights = kwargs.pop(_WEIGHT_TENSOR)
    else:
      *args, batch_weights = args
    result = dict(metric_fn(*args, **kwargs))
    result.setdefault(COUNT_METRIC, metrics.streaming_sum(batch_weights, COUNT_METRIC))
    return result

  if isinstance(tensors, dict):
    return counting_metric_fn, dict(tensors, **{_WEIGHT_TENSOR: weights})
  return counting_metric_fn, [*tensors, weights]


def with_eval_count(user_model_fn):
  """Wraps a user's model_fn so evaluation always reports num_eval_examples.

  Our input pads evaluation with weight-0 examples; the count proves every
  real record was seen exactly once, whatever metrics the user computes.
  """
  wants_config = "config" in function_utils.fn_args(user_model_fn)

  def model_fn(features, labels, mode, params, config):
    kwargs = {"config": config} if wants_config else {}
    spec = user_model_fn(features, labels, mode, params, **kwargs)
    weights = features.get(schema.WEIGHT_KEY) if isinstance(features, dict) else None
    eval_metrics = getattr(spec, "eval_metrics", None)
    if mode != stacks.ModeKeys.EVAL or weights is None or not eval_metrics:
      return spec
    # Rebuilt, not _replace()d: TPUEstimatorSpec records its host calls when
    # constructed.
    fields = dict(spec._asdict(), eval_metrics=_count_metric_fn(*eval_metrics, weights))
    return stacks.tpu.TPUEstimatorSpec(**fields)

  return model_fn


def load_model_fn(spec):
  """'package.module:function' -> the user's model_fn, wrapped by with_eval_count.

  Our own model_fn when spec is empty.
  """
  if not spec:
    return model_fn_lib.model_fn
  module_name, sep, attribute = spec.partition(":")
  if not sep or not module_name or not attribute:
    raise config_lib.ConfigError(
        f"--model_fn={spec} must look like package.module:function")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise config_lib.ConfigError(f"--model_fn={spec}: cannot import {module_name}: {e}") from e
  function = getattr(module, attribute, None)
  if not callable(function):
    raise config_lib.ConfigError(f"--model_fn={spec}: {module_name} has no function {attribute}")
  return with_eval_count(function)
