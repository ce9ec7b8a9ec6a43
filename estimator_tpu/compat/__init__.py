"""`from estimator_tpu.compat import tf`: a drop-in for `import tensorflow as tf` in TF 1 TPU code.

`tf` is `tf.compat.v1` (every attribute falls through to it) plus a
`tf.contrib` namespace: each name legacy TPU code used is mapped to its
TF 2 home, re-implemented faithfully, or refused with an AttributeError
that says what to use instead. docs/MIGRATING.md lists them all.

Nothing is imported until first use: `tf.contrib.tpu.TPUEstimator` imports
TensorFlow's estimator at that moment, not at `import estimator_tpu.compat`.
"""

from estimator_tpu.compat import registry
from estimator_tpu.compat._lazy import CompatTF

tf = CompatTF(registry.CONTRIB)

__all__ = ["tf"]
