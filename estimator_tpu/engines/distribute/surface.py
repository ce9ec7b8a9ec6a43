"""TF 2.15's TPUEstimator / Estimator public API on the distribute engine: arguments and results.

A program holds the engine where it held a TPUEstimator, so every public
method and property of TF 2.15's TPUEstimator is here or on DistributeEngine
with the same arguments (tests/test_engine_contract_surface.py compares them
with the installed TPUEstimator's): train / evaluate / predict run on the
engine, with the estimator's argument checks and NumPy results (this module's
functions); `model_fn`, `config` and the SavedModel exports are TensorFlow's
own TPUEstimator's (use_tpu=False), built with the program's arguments, which
reads the engine's checkpoints (their names are the estimator's).
"""

import copy
import os

import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib

from estimator_tpu import stacks

GLOBAL_STEP = tf.compat.v1.GraphKeys.GLOBAL_STEP
LOSS = "loss"


class EstimatorSurface:
  """The estimator's methods and properties that DistributeEngine does not run itself.

  The class that mixes it in sets `model_dir`, `_user_params`, `_run_config`
  and `_tf_estimator`: the TPUEstimator (use_tpu=False) built with the same model_fn,
  model_dir, config and params, or None.
  """

  @property
  def params(self):
    """A copy of the params the estimator was given (without batch_size, added per call)."""
    return copy.deepcopy(self._user_params)

  @property
  def config(self):
    """The estimator's RunConfig (its copy: log_step_count_steps taken over, model_dir set)."""
    if self._tf_estimator is not None:
      return self._tf_estimator.config
    return copy.deepcopy(self._run_config)

  @property
  def model_fn(self):
    """model_fn(features, labels, mode, config), bound to params, as the estimator's property."""
    return self._estimator("model_fn").model_fn

  def eval_dir(self, name=None):
    return os.path.join(self.model_dir, "eval" if not name else "eval_" + name)

  def get_variable_value(self, name):
    _check_checkpoint_available(self.model_dir)
    return tf.train.load_variable(self.model_dir, name)

  def get_variable_names(self):
    _check_checkpoint_available(self.model_dir)
    return [name for name, _ in tf.train.list_variables(self.model_dir)]

  def latest_checkpoint(self):
    return tf.train.latest_checkpoint(self.model_dir)

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                         as_text=False, checkpoint_path=None,
                         experimental_mode=stacks.ModeKeys.PREDICT):
    return self._estimator("export_saved_model").export_saved_model(
        self._export_base(export_dir_base), serving_input_receiver_fn,
        assets_extra=assets_extra, as_text=as_text, checkpoint_path=checkpoint_path,
        experimental_mode=experimental_mode)

  def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                        as_text=False, checkpoint_path=None, strip_default_attrs=False):
    return self._estimator("export_savedmodel").export_savedmodel(
        self._export_base(export_dir_base), serving_input_receiver_fn,
        assets_extra=assets_extra, as_text=as_text, checkpoint_path=checkpoint_path,
        strip_default_attrs=strip_default_attrs)

  def experimental_export_all_saved_models(self, export_dir_base, input_receiver_fn_map,
                                           assets_extra=None, as_text=False,
                                           checkpoint_path=None):
    return self._estimator("experimental_export_all_saved_models") \
        .experimental_export_all_saved_models(
            self._export_base(export_dir_base), input_receiver_fn_map,
            assets_extra=assets_extra, as_text=as_text, checkpoint_path=checkpoint_path)

  def _export_base(self, export_dir_base):
    """Where an export goes: export_dir_base (the engine sets a worker's but the chief's aside)."""
    return export_dir_base

  def _estimator(self, method):
    if self._tf_estimator is None:
      raise ValueError(
          f"{method} needs the TPUEstimator the engine exports with, and this engine was built "
          "without one: build it as TPUEstimator(...) under ESTIMATOR_TPU_ENGINE=distribute or "
          "with engines.choose.build_estimator")
    return self._tf_estimator


def _check_checkpoint_available(model_dir):
  if not tf.train.latest_checkpoint(model_dir):
    raise ValueError(f"Could not find trained model in model_dir: {model_dir}.")


# train()


def check_train_steps(steps, max_steps):
  """Estimator.train's checks of steps and max_steps."""
  if steps is not None and max_steps is not None:
    raise ValueError("Can not provide both steps and max_steps.")
  if steps is not None and steps <= 0:
    raise ValueError(f"Must specify steps > 0, given: {steps}")
  if max_steps is not None and max_steps <= 0:
    raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")


def max_steps_reached(model_dir, max_steps):
  """Whether the newest checkpoint in model_dir is at max_steps or beyond (train() returns)."""
  if max_steps is None:
    return False
  return max_steps <= estimator_lib._load_global_step_from_checkpoint_dir(  # pylint: disable=protected-access
      model_dir)


# evaluate()


def check_eval_steps(steps):
  if steps is not None and steps <= 0:
    raise ValueError(f"Must specify steps > 0, given: {steps}")


class MeanLoss:
  """The evaluation's `loss`: tf.compat.v1.metrics.mean of the batches' losses, in float32."""

  def __init__(self):
    self._total = np.float32(0)
    self._count = np.float32(0)

  def add(self, loss):
    self._total = np.float32(self._total + np.float32(loss))
    self._count = np.float32(self._count + 1)

  def value(self):
    return np.float32(self._total / self._count) if self._count else np.float32(0)


def evaluation_results(metrics, loss, global_step):
  """evaluate()'s dict: the metrics and `loss` by name, then `global_step` (np.int64).

  Args:
    metrics: {name: NumPy value} of the eval metrics.
    loss: the mean loss, np.float32.
    global_step: the step of the evaluated variables.

  Raises:
    ValueError: a metric is named `loss` or `global_step`, which the estimator refuses.
  """
  if LOSS in metrics:
    raise ValueError(f'Metric with name "{LOSS}" is not allowed, because Estimator already '
                     "defines a default metric with the same name.")
  if GLOBAL_STEP in metrics:
    raise ValueError(f"Metric with name `{GLOBAL_STEP}` is not allowed, because Estimator "
                     "already defines a default metric with the same name.")
  results = dict(sorted({**metrics, LOSS: loss}.items()))
  results[GLOBAL_STEP] = np.int64(global_step)
  return results


# predict()


def check_predict_keys(names, are_dict, predict_keys):
  """The prediction names predict() yields (Estimator._extract_keys), in the model_fn's order."""
  if not predict_keys:
    return list(names)
  if not are_dict:
    raise ValueError("predict_keys argument is not valid in case of non-dict predictions.")
  kept = [name for name in names if name in predict_keys]
  if not kept:
    raise ValueError(f"Expected to run at least one output from {dict.fromkeys(names).keys()}, "
                     f"provided {predict_keys}.")
  return kept


def examples(batch, are_dict, yield_single_examples):
  """What predict() yields for one batch {name: array}: the batch, or example by example.

  Args:
    batch: {name: NumPy array}; for predictions that are not a dict, its one
      entry is the model_fn's tensor.
    are_dict: whether the model_fn's predictions are a dict.
    yield_single_examples: Estimator.predict's argument.
  """
  if not are_dict:
    (batch,) = batch.values()
  if not yield_single_examples:
    yield batch
  elif not are_dict:
    yield from batch
  else:
    for i in range(_batch_length(batch)):
      yield {name: value[i] for name, value in batch.items()}


def _batch_length(batch):
  length = None
  for name, value in batch.items():
    length = length or value.shape[0]
    if value.shape[0] != length:
      raise ValueError(f"Batch length of predictions should be same. {name} has different "
                       "batch length than others.")
  return length
