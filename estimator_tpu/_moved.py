"""Module paths that moved: a name imported as an object that lives elsewhere.

`import estimator_tpu.preprocessing` (say) still works for one release: it gives
the module's new home, estimator_tpu.data.image_ops, and warns once with the
new path (the flat layout before data/, beam/, training/, tpu/, export/).
`AliasLoader` is the mechanism, shared with estimator_tpu.compat's module paths
(`tensorflow.contrib...`, `tensorflow.python.estimator...`).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

# Old module (under estimator_tpu) -> its new home.
MOVED = {
    "features": "estimator_tpu.data.schema",
    "dataset_info": "estimator_tpu.data.data_dir",
    "preprocessing": "estimator_tpu.data.image_ops",
    "input_pipeline": "estimator_tpu.data.input_pipeline",
    "preprocess_flags": "estimator_tpu.beam.options",
    "preprocess_inputs": "estimator_tpu.beam.sources",
    "preprocess_plan": "estimator_tpu.beam.plan",
    "beam_pipeline": "estimator_tpu.beam.pipeline",
    "model": "estimator_tpu.model.networks",
    "metrics": "estimator_tpu.model.metrics",
    "optimization": "estimator_tpu.model.optimization",
    "estimator": "estimator_tpu.engines.choose",
    "distributed": "estimator_tpu.engines.strategy_estimator",
    "loop": "estimator_tpu.run.loop",
    "curves": "estimator_tpu.run.curves",
    "runner": "estimator_tpu.run.assemble",
    "tpu_checks": "estimator_tpu.tpu.checks",
    "export_lib": "estimator_tpu.export.saved_model",
}
# training/ held three kinds of module; each kind has a folder now (model/, engines/, run/).
MOVED_TRAINING = {
    "networks": "estimator_tpu.model.networks",
    "model_fn": "estimator_tpu.model.model_fn",
    "metrics": "estimator_tpu.model.metrics",
    "optimization": "estimator_tpu.model.optimization",
    "device_augmentation": "estimator_tpu.model.device_augmentation",
    "user_model_fn": "estimator_tpu.model.user_model_fn",
    "tpu_estimator": "estimator_tpu.engines.choose",
    "host_loop": "estimator_tpu.engines.host_loop",
    "strategy_estimator": "estimator_tpu.engines.strategy_estimator",
    "distribute_engine": "estimator_tpu.engines.distribute.engine",
    "distribute_hooks": "estimator_tpu.engines.distribute.hooks",
    "tf1_variables": "estimator_tpu.engines.distribute.variables",
    "optimizer_rules": "estimator_tpu.engines.distribute.optimizer_rules",
    "loop": "estimator_tpu.run.loop",
    "assemble": "estimator_tpu.run.assemble",
    "checkpoints": "estimator_tpu.run.checkpoints",
    "preemption": "estimator_tpu.run.preemption",
    "curves": "estimator_tpu.run.curves",
    "determinism": "estimator_tpu.run.determinism",
}
TRAINING = "estimator_tpu.training"
# estimator_tpu.datasets is a file of its own (datasets.py), so `python -m` still runs it.
# model_fn and preflight are names of the public API now (the function, not the module).


def moved_message(old, new):
  return f"{old} moved to {new}; the old path goes away in the next release"


class AliasLoader(importlib.abc.Loader):
  """Loads a module name as an object `make()` returns; no code runs for the name itself.

  The import system stamps the alias's spec on the object it loads; the
  object's own spec (a real module's, or None) is put back afterwards, so the
  module keeps its one true name.
  """

  def __init__(self, make):
    self._make = make
    self._spec = None

  def create_module(self, spec):
    module = self._make()
    self._spec = module.__dict__.get("__spec__")
    return module

  def exec_module(self, module):
    if self._spec is not None:
      module.__spec__ = self._spec


def _moved_module(old, new):
  def make():
    warnings.warn(moved_message(old, new), FutureWarning, stacklevel=3)
    return importlib.import_module(new)
  return make


def _training_package():
  """estimator_tpu.training as an empty package, so its old submodule paths resolve."""
  module = types.ModuleType(TRAINING, "The old training/ folder: see model/, engines/, run/.")
  module.__path__ = []
  return module


class MovedFinder(importlib.abc.MetaPathFinder):
  """Finds estimator_tpu.<old name> and estimator_tpu.training.<old name> as their new modules."""

  def find_spec(self, fullname, path=None, target=None):
    package, _, name = fullname.rpartition(".")
    if fullname == TRAINING:
      return importlib.util.spec_from_loader(fullname, AliasLoader(_training_package),
                                             is_package=True)
    if package == TRAINING and name in MOVED_TRAINING:
      new = MOVED_TRAINING[name]
    elif package == "estimator_tpu" and name in MOVED:
      new = MOVED[name]
    else:
      return None
    return importlib.util.spec_from_loader(fullname,
                                           AliasLoader(_moved_module(fullname, new)))


def install():
  if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(MovedFinder())
