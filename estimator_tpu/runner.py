"""From parsed flags to a ready run: config (with config.json), data, model_fn, estimator."""

import importlib
import logging
import sys

import tensorflow as tf
from tensorflow.python.util import function_utils  # pylint: disable=g-direct-tensorflow-import

from estimator_tpu import config as config_lib
from estimator_tpu import dataset_info
from estimator_tpu import estimator as estimator_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import input_pipeline
from estimator_tpu import metrics
from estimator_tpu import model_fn as model_fn_lib
from estimator_tpu import stacks


def quiet_tensorflow():
  """Keeps TF's and absl's INFO chatter out of what the user reads.

  TF's C++ logs obey TF_CPP_MIN_LOG_LEVEL, which entry points set before
  importing TensorFlow.
  """
  tf.get_logger().setLevel(logging.ERROR)
  logging.getLogger("estimator_tpu").setLevel(logging.WARNING)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)


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
    weights = features.get(input_pipeline.WEIGHT_KEY) if isinstance(features, dict) else None
    eval_metrics = getattr(spec, "eval_metrics", None)
    if mode != stacks.ModeKeys.EVAL or weights is None or not eval_metrics:
      return spec
    # Rebuilt, not _replace()d: TPUEstimatorSpec records its host calls when
    # constructed.
    fields = dict(spec._asdict(), eval_metrics=_count_metric_fn(*eval_metrics, weights))
    return stacks.tpu.TPUEstimatorSpec(**fields)

  return model_fn


def make_main(program, run, flag_values):
  """absl's main(argv) for an entry point: stray arguments are an error (exit 2)."""

  def main(argv):
    if len(argv) > 1:
      print(f"{program}: error: unexpected arguments {argv[1:]}", file=sys.stderr)
      return 2
    return run(flag_values)

  return main


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


def prepare(flag_values, need_train, need_eval, write=True):
  """Merges flags with model_dir/config.json, validates, resolves the data.

  Args:
    flag_values: parsed absl FlagValues (after flags_lib.define_flags()).
    need_train: the run trains (training files must exist).
    need_eval: the run evaluates (evaluation files must exist).
    write: write the resolved config to model_dir/config.json.

  Returns:
    (config, DataInfo).

  Raises:
    ConfigError: a message naming the flag or file and the fix.
  """
  model_dir = flag_values["model_dir"].value
  if not model_dir:
    raise config_lib.ConfigError("--model_dir is required")
  saved = config_lib.read_config(model_dir)
  config = flags_lib.config_from_flags(flag_values, saved=saved)
  config = config.replace("runtime", model_dir=model_dir).validate()
  info = dataset_info.resolve(config.data, need_train=need_train, need_eval=need_eval)
  config = config.replace("data", num_label_classes=info.num_classes,
                          class_names=tuple(info.class_names),
                          num_train_examples=info.num_train_examples,
                          num_eval_examples=info.num_eval_examples)
  if saved is not None:
    config_lib.check_compatible(saved, config)
  if write:
    config_lib.write_config(config)
  return config, info


def prepare_export(model_dir, export_dir):
  """The saved config (set up for CPU/GPU) and latest checkpoint of model_dir.

  Raises:
    ConfigError: no --model_dir/--export_dir, no config.json or no checkpoint.
  """
  if not model_dir or not export_dir:
    raise config_lib.ConfigError("--model_dir and --export_dir are required")
  saved = config_lib.read_config(model_dir)
  if saved is None:
    raise config_lib.ConfigError(
        f"--model_dir={model_dir} holds no {config_lib.CONFIG_FILE}: train there first")
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    raise config_lib.ConfigError(
        f"--model_dir={model_dir} holds no checkpoint: train there first")
  # Never the TPU graph: the export is for CPU/GPU serving.
  config = saved.replace("runtime", model_dir=model_dir, use_tpu=False, strategy="none")
  return config, checkpoint


def build(config, **kwargs):
  """The TPUEstimator running the configured model_fn.

  With --seed, Keras's initializers (which draw their seeds from Python's
  random module, not the graph seed) are seeded too, so weights repeat.
  """
  if config.train.seed:
    stacks.keras.utils.set_random_seed(config.train.seed)
  return estimator_lib.build_estimator(
      config, class_names=config.data.class_names,
      model_fn=load_model_fn(config.model.model_fn), **kwargs)
