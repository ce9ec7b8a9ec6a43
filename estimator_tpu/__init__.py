"""TPUEstimator image classification that runs unchanged on CPU, GPU and TPU.

Importing the package prepares TensorFlow for TPUEstimator code, whatever was
imported first: on TF >= 2.16 `tf.keras` means Keras 2 (tf-keras), which
TensorFlow reads when `tf.keras` is first used, and the four TF-internal
modules the estimator imports are served by estimator_tpu.tf_standins where
TensorFlow lacks them. Neither imports TensorFlow.
"""

import importlib.util
import os

# Only where tf-keras is installed (the current stack; TF 2.15's Keras is Keras 2
# already and would fail to find tf_keras). An explicit TF_USE_LEGACY_KERAS=0 is kept.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from estimator_tpu import tf_standins  # pylint: disable=g-import-not-at-top,wrong-import-position

tf_standins.install()

__version__ = "0.1.0"
