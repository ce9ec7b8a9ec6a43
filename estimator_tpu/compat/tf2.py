"""`from estimator_tpu.compat import tf2 as tf`: TF 2 plus `tf.estimator`, for TF 2-era code.

TF 2.16 removed `tf.estimator`; code written for TF 2.x (`import tensorflow as
tf`, premade `tf.estimator.DNNClassifier` over `tf.feature_column`s,
`tf.estimator.train_and_evaluate`, `tf.keras.estimator.model_to_estimator`)
fails with `module 'tensorflow' has no attribute 'estimator'`. This module is
that code's `tf`: every attribute is the installed TensorFlow's own (TF 2
shapes, eager by default, `tf.saved_model.load` the TF 2 loader, `tf.keras`
Keras 2), and

- `tf.estimator` is `tensorflow_estimator`'s TF 2 API, as TF 2.15 had it:
  premade estimators with TF 2's loss reduction (the mean over the batch),
  Keras (legacy) optimizer instances accepted, `export`, `RunConfig`, hooks,
  `train_and_evaluate`. `BoostedTrees*` (removed before TF 2.15) raise an
  AttributeError that names TensorFlow Decision Forests;
- `tf.compat.v1.estimator` (the TF 1 API, `inputs.numpy_input_fn` included) and
  `tf.compat.v2.estimator` are there (estimator_tpu.tf_standins).

Importing it sets nothing process-wide beyond those two attributes, so TF 1
code beside it (`from estimator_tpu.compat import tf`) runs as before. The
other way round holds only in part: the compat `tf` turns on TF 1 TensorShapes
and graph mode with TensorFlow's own switches, each one flag for the whole
process; run TF 2 code beside it with ESTIMATOR_TPU_COMPAT_SHAPES=v2 and
ESTIMATOR_TPU_COMPAT_EXECUTION=eager, or in its own process.
"""

# Private names only: any public one would hide TensorFlow's (tf.types, ...).
import importlib as _importlib
import types as _types

import tensorflow as _tf

from estimator_tpu import stacks as _stacks  # noqa: F401 -- stand-ins, Keras 2
from estimator_tpu import tf_standins as _tf_standins

_ESTIMATOR_V2 = "tensorflow_estimator._api.v2.estimator"
BOOSTED_TREES = (
    "tf.estimator.{name} is gone from the estimator (removed before TF 2.15); use "
    "TensorFlow Decision Forests (`pip install tensorflow_decision_forests`, "
    "tfdf.keras.GradientBoostedTreesModel), which trains the same kind of model")


class _Estimator(_types.ModuleType):
  """`tf.estimator`: tensorflow_estimator's TF 2 API, refusing the gone BoostedTrees*."""

  def __init__(self):
    super().__init__("estimator_tpu.compat.tf2.estimator", _Estimator.__doc__)
    self.__dict__["_api"] = _importlib.import_module(_ESTIMATOR_V2)

  def __getattr__(self, name):
    if name.startswith("BoostedTrees"):
      raise AttributeError(BOOSTED_TREES.format(name=name))
    return getattr(self._api, name)

  def __dir__(self):
    return dir(self._api)


_tf_standins.restore_estimator_attributes()
estimator = _Estimator()
__version__ = _tf.__version__


def __getattr__(name):
  return getattr(_tf, name)


def __dir__():
  return sorted(set(dir(_tf)) | {"estimator"})
