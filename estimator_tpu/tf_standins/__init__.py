"""Stand-ins for the four TF-internal modules that TF >= 2.16 removed and the estimator imports.

`tf-estimator-nightly` (the last estimator build) imports
`tensorflow.python.distribute.estimator_training`,
`tensorflow.python.tpu.tpu_embedding`, `tensorflow.python.tpu.tpu_embedding_gradient`
and `tensorflow.python.tpu.session_support`. install() puts a finder at the end of
`sys.meta_path`: TensorFlow's own module wins wherever it exists (TF 2.15), and the
stand-in beside this file is served only where TensorFlow has none. Nothing is
imported until the estimator asks for the module.
"""

import importlib
import importlib.abc
import importlib.util
import sys

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
}


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
    if standin is None:
      return None
    return importlib.util.spec_from_loader(fullname, _StandinLoader(standin))


def install():
  """Adds the finder once (last, so TensorFlow's own modules always win)."""
  if not any(isinstance(finder, StandinFinder) for finder in sys.meta_path):
    sys.meta_path.append(StandinFinder())


def active():
  """The TensorFlow module names now served by a stand-in (empty on TF 2.15)."""
  return sorted(name for name, standin in STANDINS.items()
                if getattr(sys.modules.get(name), "__name__", None) == standin)
