"""The one way to reach TensorFlow's estimator API and Keras 2, on either stack.

    tf2.15   TensorFlow 2.15 with tensorflow-estimator 2.15 and Keras 2.15
    current  TensorFlow >= 2.16 with tf-estimator-nightly and tf-keras

`estimator` is the TF 1 estimator namespace (what `tf.compat.v1.estimator` was
on TF 2.15: Estimator, RunConfig, ModeKeys, export, tpu.TPUEstimator, ...),
taken from the `tensorflow_estimator` package on both stacks because TF 2.16
dropped `tf.estimator`. `keras` is Keras 2 on both stacks. The package's
`__init__` has already made the removed TF modules the estimator imports
available (estimator_tpu.tf_standins) and routed `tf.keras` to Keras 2.
"""

from importlib import metadata

import tensorflow as tf
import tensorflow_estimator

TF_VERSION = tuple(int(part) for part in tf.__version__.split(".")[:2])
NAME = "current" if TF_VERSION >= (2, 16) else "tf2.15"

estimator = tensorflow_estimator.estimator
tpu = estimator.tpu
ModeKeys = estimator.ModeKeys

if NAME == "current":
  import tf_keras as keras
else:
  keras = tf.keras


# The distributions that make each stack, as pip names them.
_PACKAGES = {
    "current": ("tf-estimator-nightly", "tf-keras"),
    "tf2.15": ("tensorflow-estimator", "keras"),
}


def describe():
  """One line naming the stack and its versions, for logs and bug reports."""
  versions = [f"TensorFlow {tf.__version__}"]
  versions += [f"{name} {metadata.version(name)}" for name in _PACKAGES[NAME]]
  return f"stack {NAME}: " + ", ".join(versions)
