"""`from estimator_tpu.compat import tf`: a drop-in for `import tensorflow as tf` in TF 1 TPU code.

`tf` is `tf.compat.v1` (every attribute falls through to it) plus a
`tf.contrib` namespace: each name legacy TPU code used is mapped to its
TF 2 home, re-implemented faithfully, or refused with an AttributeError
that says what to use instead. docs/MIGRATING.md lists them all.

Importing it adds one import hook (estimator_tpu.compat.module_paths) so that
`import tensorflow.contrib...` and TF 1's module paths (`tensorflow.gfile`)
resolve to the same objects, and one that gives the tf-slim package
(`tf.contrib.slim`) the TF names it needs (estimator_tpu.compat.slim). It
imports no TensorFlow: `tf.contrib.tpu.TPUEstimator` imports TensorFlow's
estimator at that moment. The first use of `tf` sets up the process for TF 1
code (TF 1 shapes, no deprecation messages; estimator_tpu.compat.activation).
TensorFlow's TPUEstimator, by whatever path a program reaches it, runs on the
engine ESTIMATOR_TPU_ENGINE names (estimator_tpu.compat.routing).
"""

import os
import sys

from estimator_tpu.compat import module_paths
from estimator_tpu.compat import registry
from estimator_tpu.compat import routing
from estimator_tpu.compat import slim
from estimator_tpu.compat._lazy import CompatTF

# TF 1.15 printed no C++ INFO lines once it had started; TF 2 prints some on its own
# (`MLIR V1 optimization pass is not enabled`, `TFRecordDataset buffer_size is unspecified`).
# TensorFlow reads the level when it loads, so it is set here, before that, unless the
# user chose one (TF_CPP_MIN_LOG_LEVEL=0 shows them again).
if "tensorflow" not in sys.modules:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

tf = CompatTF(registry.CONTRIB, registry.V1_OVERLAYS)
module_paths.install()
slim.install()
routing.install()

__all__ = ["tf"]
