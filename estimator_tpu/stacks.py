"""The one way to reach TensorFlow's estimator API and Keras 2, on every stack.

    tf2.15   TensorFlow 2.15 with tensorflow-estimator 2.15 and Keras 2.15
    current  TensorFlow >= 2.16 with tf-estimator-nightly and tf-keras
    tpu      the same on TensorFlow's TPU build (tensorflow-tpu 2.20 with libtpu)

`estimator` is the TF 1 estimator namespace (what `tf.compat.v1.estimator` was
on TF 2.15: Estimator, RunConfig, ModeKeys, export, tpu.TPUEstimator, ...),
taken from the `tensorflow_estimator` package on every stack because TF 2.16
dropped `tf.estimator`. `keras` is Keras 2 on every stack. The package's
`__init__` has already made the removed TF modules the estimator imports
available (estimator_tpu.tf_standins) and routed `tf.keras` to Keras 2.
"""

from importlib import metadata
import re

import tensorflow as tf
import tensorflow_estimator

from estimator_tpu import keras_loaders
from estimator_tpu import libtpu_guard

TF_VERSION = tuple(int(part) for part in tf.__version__.split(".")[:2])
# From TF 2.16 on, Keras 2 is the tf-keras package and the estimator tf-estimator-nightly.
KERAS_2_IS_TF_KERAS = TF_VERSION >= (2, 16)
if not KERAS_2_IS_TF_KERAS:
  NAME = "tf2.15"
elif libtpu_guard.is_tpu_build():
  NAME = "tpu"
else:
  NAME = "current"

# TensorFlow's TPU build has no XLA backend for the host's CPU: jit_compile and
# xla.compile fail there ("could not find registered transfer manager for
# platform Host"), on a TPU VM's host as on any other; it compiles for the TPU.
HOST_XLA = NAME != "tpu"

estimator = tensorflow_estimator.estimator
tpu = estimator.tpu
ModeKeys = estimator.ModeKeys

if KERAS_2_IS_TF_KERAS:
  import tf_keras as keras
else:
  keras = tf.keras

# tf.keras and friends choose their Keras here, before strategies start replica threads.
keras_loaders.settle()


# The import packages that make each stack beside TensorFlow. Their distributions are looked
# up, not assumed: pip names differ between releases and nightlies (tf-keras and
# tf-keras-nightly, tensorflow, tensorflow-cpu, tensorflow-tpu and tf-nightly).
_PACKAGES = {
    "current": ("tensorflow", "tensorflow_estimator", "tf_keras"),
    "tpu": ("tensorflow", "tensorflow_estimator", "tf_keras", "libtpu"),
    "tf2.15": ("tensorflow", "tensorflow_estimator", "keras"),
}


def distributions(package):
  """[(distribution, version)] installed that provide import package `package` (sorted)."""
  names = metadata.packages_distributions().get(package, ())
  # As pip prints them (PEP 503): a wheel's metadata may say tf_keras or tensorflow_cpu.
  return sorted({(re.sub(r"[-_.]+", "-", name).lower(), metadata.version(name))
                 for name in names})


def describe():
  """One line naming the stack and its versions, for logs and bug reports."""
  versions = [f"TensorFlow {tf.__version__}"]
  for package in _PACKAGES[NAME]:
    found = distributions(package) or [(f"{package} (no distribution)", "?")]
    versions += [f"{name} {version}" for name, version in found]
  return f"stack {NAME}: " + ", ".join(versions)
