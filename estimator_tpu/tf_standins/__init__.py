"""Stand-ins for TF-internal modules that TF >= 2.16 removed and TF 1-era code imports.

`tf-estimator-nightly` (the last estimator build) imports
`tensorflow.python.distribute.estimator_training`,
`tensorflow.python.tpu.tpu_embedding`, `tensorflow.python.tpu.tpu_embedding_gradient`
and `tensorflow.python.tpu.session_support`; TF 1-era TPU programs import
`tensorflow.python.eager.profiler`. install() puts a finder at the end of
`sys.meta_path`: TensorFlow's own module wins wherever it exists (TF 2.15), and the
stand-in beside this file is served only where TensorFlow has none. Nothing is
imported until the estimator asks for the module.

The same finder serves the estimator's API under the paths TF 2.15 gave it and
TF >= 2.16 dropped, as aliases of `tensorflow_estimator`'s API modules (ESTIMATOR_APIS):
`import tensorflow.compat.v1.estimator` and `from tensorflow.compat.v1 import estimator`
(the form Google's TPU programs took in 2022-23), likewise `tensorflow.compat.v2.estimator`
and their submodules (`tensorflow.compat.v1.estimator.tpu`). `restore_estimator_attributes()`
puts the same modules on `tf.compat.v1` / `tf.compat.v2` as lazy attributes, as TF 2.15
had them. `tensorflow.estimator` itself is not restored: `import tensorflow as tf` keeps
telling the truth about the installed TensorFlow (`hasattr(tf, "estimator")` is False on
TF >= 2.16); TF 2-era estimator code uses `from estimator_tpu.compat import tf2 as tf`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from estimator_tpu import _moved

# TensorFlow's module name -> the stand-in that serves it.
STANDINS = {
    "tensorflow.python.distribute.estimator_training":
        "estimator_tpu.tf_standins.estimator_training",
    "tensorflow.python.tpu.tpu_embedding":
        "estimator_tpu.tf_standins.tpu_embedding",
    "tensorflow.python.tpu.tpu_embedding_gradient":
        "estimator_tpu.tf_standins.tpu_embedding_gradient",
    "tensorflow.python.tpu.session_support":
        "estimator_tpu.tf_standins.session_support",
    "tensorflow.python.eager.profiler":
        "estimator_tpu.tf_standins.eager_profiler",
}

# TF 2.15's paths of the estimator API -> the tensorflow_estimator module that serves them.
ESTIMATOR_APIS = {
    "tensorflow.compat.v1.estimator": "tensorflow_estimator._api.v1.estimator",
    "tensorflow.compat.v2.estimator": "tensorflow_estimator._api.v2.estimator",
}


def estimator_alias(fullname):
  """The tensorflow_estimator module an ESTIMATOR_APIS path (or a submodule of one) names."""
  for path, api in ESTIMATOR_APIS.items():
    if fullname == path or fullname.startswith(path + "."):
      return api + fullname[len(path):]
  return None


class _StandinLoader(importlib.abc.Loader):
  """Loads a TensorFlow module name as the stand-in module object itself."""

  def __init__(self, standin):
    self._standin = standin

  def create_module(self, spec):
    return importlib.import_module(self._standin)

  def exec_module(self, module):
    pass  # The stand-in ran when create_module imported it.


class StandinFinder(importlib.abc.MetaPathFinder):
  """Finds the removed TensorFlow modules; consulted only after every other finder."""

  def find_spec(self, fullname, path=None, target=None):
    standin = STANDINS.get(fullname)
    if standin is not None:
      return importlib.util.spec_from_loader(fullname, _StandinLoader(standin))
    api = estimator_alias(fullname)
    if api is None or importlib.util.find_spec(api) is None:
      return None
    loader = _moved.AliasLoader(lambda: importlib.import_module(api))
    return importlib.util.spec_from_loader(fullname, loader, is_package=True)


def install():
  """Adds the finder once (last, so TensorFlow's own modules always win)."""
  if not any(isinstance(finder, StandinFinder) for finder in sys.meta_path):
    sys.meta_path.append(StandinFinder())


def restore_estimator_attributes():
  """Where TensorFlow lacks them, sets `tf.compat.v1.estimator` and `tf.compat.v2.estimator`.

  Each is TensorFlow's own LazyLoader (as on TF 2.15): the estimator is imported
  on first use. Imports TensorFlow; call it where TensorFlow is in use already.
  """
  import tensorflow as tf
  from tensorflow.python.util import lazy_loader
  # tf.compat.v1.compat.v1 (what TF 1 code's `tf.compat.v1` is under the compat tf) and
  # friends are modules of their own.
  parents = {"v1": [tf.compat.v1, tf.compat.v1.compat.v1, tf.compat.v2.compat.v1],
             "v2": [tf.compat.v2, tf.compat.v1.compat.v2, tf.compat.v2.compat.v2]}
  for path, api in ESTIMATOR_APIS.items():
    for parent in parents[path.split(".")[2]]:
      if "estimator" not in dir(parent):
        parent.estimator = (sys.modules.get(path)
                            or lazy_loader.LazyLoader("estimator", {}, api))


def active():
  """The TensorFlow module names now served by a stand-in (empty on TF 2.15)."""
  return sorted(name for name, standin in STANDINS.items()
                if getattr(sys.modules.get(name), "__name__", None) == standin)
