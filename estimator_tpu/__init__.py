"""TPUEstimator image classification that runs unchanged on CPU, GPU and TPU.

The public API (each name is imported on first use, so `import estimator_tpu`
stays cheap and imports no TensorFlow):

    Config, ConfigError        the typed run configuration (config.json) and its error
    make_input_fn              the TPUEstimator input_fn over preprocess.py's records
    model_fn                   the TPUEstimator model_fn (flowers CNN, ResNet, tiny)
    build_estimator            TPUEstimator, or an Estimator under a tf.distribute strategy
    with_device_augmentation   model_fn -> model_fn that applies --augment_on=device draws first
    train_and_evaluate         the train/eval/checkpoint loop train.py runs
    export_saved_model         checkpoint -> SavedModel for TF Serving (JPEG bytes in)
    preflight                  on CPU: would this config run on a TPU? (a list of findings)
    stacks                     the estimator API and Keras 2 on either TensorFlow stack

Importing the package also prepares TensorFlow for TPUEstimator code, whatever
was imported first: on TF >= 2.16 `tf.keras` means Keras 2 (tf-keras), which
TensorFlow reads when `tf.keras` is first used, and the four TF-internal
modules the estimator imports are served by estimator_tpu.tf_standins where
TensorFlow lacks them. If TensorFlow is imported after it, TensorFlow's C++
start-up lines stay off stderr (estimator_tpu.tf_startup), and on a host with
no TPU attached the TPU build of TensorFlow asks no cloud metadata server for
one (estimator_tpu.libtpu_guard). None of these imports TensorFlow.
"""

import importlib
import importlib.util
import os
import sys

# First: on a host with no TPU, the TPU build's libtpu must not ask a cloud
# metadata server for one when TensorFlow loads (estimator_tpu.libtpu_guard).
from estimator_tpu import libtpu_guard

libtpu_guard.apply()

# Only where tf-keras is installed (the current and tpu stacks; TF 2.15's Keras is Keras 2
# already and would fail to find tf_keras). An explicit TF_USE_LEGACY_KERAS=0 is kept.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from estimator_tpu import _moved  # noqa: E402 -- after the Keras switch, before TensorFlow
from estimator_tpu import tf_standins  # noqa: E402
from estimator_tpu import tf_startup  # noqa: E402

tf_startup.install()
tf_standins.install()
_moved.install()
if "tensorflow" in sys.modules:  # imported first: tf.keras's loaders choose here, not in threads
  from estimator_tpu import keras_loaders  # noqa: E402

  keras_loaders.settle()

__version__ = "0.1.0"

_PUBLIC = {
    "Config": "estimator_tpu.config:Config",
    "ConfigError": "estimator_tpu.config:ConfigError",
    "make_input_fn": "estimator_tpu.data.input_pipeline:make_input_fn",
    "model_fn": "estimator_tpu.model.model_fn:model_fn",
    "build_estimator": "estimator_tpu.engines.choose:build_estimator",
    "with_device_augmentation":
        "estimator_tpu.model.device_augmentation:with_device_augmentation",
    "train_and_evaluate": "estimator_tpu.run.loop:train_and_evaluate",
    "export_saved_model": "estimator_tpu.export.saved_model:export_saved_model",
    "preflight": "estimator_tpu.tpu.preflight:run_checks",
    "stacks": "estimator_tpu.stacks:",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
  target = _PUBLIC.get(name)
  if target is None:
    raise AttributeError(f"module 'estimator_tpu' has no attribute {name!r}")
  module_name, _, attribute = target.partition(":")
  module = importlib.import_module(module_name)
  value = getattr(module, attribute) if attribute else module
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_PUBLIC))
