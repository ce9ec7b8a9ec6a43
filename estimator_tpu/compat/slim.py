"""`tf.contrib.slim` is the tf-slim package, with the TensorFlow names it still needs.

TF-Slim left TensorFlow as the `tf-slim` package (pinned in every lock), whose
last release (1.1.0) reaches into TF-internal modules for names TF 2 has since
moved: `ops.Tensor`, `control_flow_ops.cond` and `.case`, `array_ops.stack`, ...
(SUPPLIED lists them, each with its TF 2 home). Once estimator_tpu.compat is
imported, every `tf_slim` module is loaded by its own file as usual and then
sees, in place of each such TF module, a view of it (`TensorFlowModule`) that
adds the moved names; TensorFlow's modules themselves, and what any other
code sees, are left as they are. tests/test_compat_slim.py reads every tf_slim
module and checks that each TF name it uses resolves on the installed TensorFlow.

`tensorflow.contrib.slim...`, `tensorflow.contrib.framework.python.ops...` and
`tensorflow.contrib.layers.python.layers...` lead here by registry.MODULE_RULES.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types

from estimator_tpu.compat import _lazy

PACKAGE = "tf_slim"
DISTRIBUTION = "tf-slim"

# TF-internal module tf_slim imports -> {name it uses that TF 2 moved: its TF 2 home}.
SUPPLIED = {
    "tensorflow.python.framework.ops": {
        "Tensor": "tensorflow.python.framework.tensor:Tensor",
        "IndexedSlices": "tensorflow.python.framework.indexed_slices:IndexedSlices",
    },
    "tensorflow.python.ops.control_flow_ops": {
        "cond": "tensorflow.python.ops.cond:cond",
        "case": "tensorflow.python.ops.control_flow_case:case",
        "Assert": "tensorflow.python.ops.control_flow_assert:Assert",
        "while_loop": "tensorflow.python.ops.while_loop:while_loop",
    },
    "tensorflow.python.ops.array_ops": {
        "stack": "tensorflow.python.ops.array_ops_stack:stack",
        "unstack": "tensorflow.python.ops.array_ops_stack:unstack",
    },
    "tensorflow.python.ops.variable_scope": {
        # TF 1.15's variable_scope.variable built a tf.compat.v1.Variable (VariableV1).
        "variable": "tensorflow:compat.v1.Variable",
    },
    "tensorflow.python.layers.normalization": {
        # TF's own path points at a Keras module that no longer exists there.
        "BatchNormalization": "tensorflow:compat.v1.layers.BatchNormalization",
    },
}

_lock = threading.Lock()
_views = {}


class TensorFlowModule(types.ModuleType):
  """A TF module as tf_slim sees it: the module's own names, then SUPPLIED's where it has none."""

  def __init__(self, module, supplied):
    super().__init__(module.__name__, module.__doc__)
    self.__dict__["_module"] = module
    self.__dict__["_supplied"] = supplied

  def __getattr__(self, name):
    try:
      return getattr(self._module, name)
    except (AttributeError, ImportError):
      if name not in self._supplied:
        raise
    value = _lazy.load(self._supplied[name])
    self.__dict__[name] = value
    return value

  def __dir__(self):
    return sorted(set(dir(self._module)) | set(self._supplied))


def view(module):
  """The TensorFlowModule of a SUPPLIED module (one per module)."""
  with _lock:
    if module.__name__ not in _views:
      _views[module.__name__] = TensorFlowModule(module, SUPPLIED[module.__name__])
    return _views[module.__name__]


def supply(module):
  """Rebinds the SUPPLIED TF modules among `module`'s globals to their views."""
  for name, value in list(vars(module).items()):
    if (isinstance(value, types.ModuleType) and not isinstance(value, TensorFlowModule)
        and value.__name__ in SUPPLIED):
      setattr(module, name, view(value))


class _SupplyingLoader(importlib.abc.Loader):
  """Runs a tf_slim module's own loader, then supply()."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    supply(module)

  def __getattr__(self, name):  # get_source, get_filename, is_package: the file's loader's
    return getattr(self._loader, name)


class SlimFinder(importlib.abc.MetaPathFinder):
  """Finds tf_slim's modules where Python would, and gives them _SupplyingLoader."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _SupplyingLoader(spec.loader)
    return spec


def install():
  """Adds SlimFinder first; tf_slim modules imported before it get their views now."""
  if not any(isinstance(finder, SlimFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, SlimFinder())
  for name, module in list(sys.modules.items()):
    if module is not None and (name == PACKAGE or name.startswith(PACKAGE + ".")):
      supply(module)


def package():
  """The tf_slim package with `nets` loaded (as `tf.contrib.slim.nets` was there in TF 1.15).

  Raises:
    ImportError: tf-slim is not installed, saying how to install it.
  """
  install()
  try:
    slim = importlib.import_module(PACKAGE)
  except ModuleNotFoundError as err:
    if err.name != PACKAGE:
      raise
    raise ImportError(
        f"tf.contrib.slim is the {DISTRIBUTION} package, which is not installed: "
        f"pip install -r requirements/<stack>.lock (make install) pins it") from None
  importlib.import_module(PACKAGE + ".nets")
  return slim


def __getattr__(name):
  if name == PACKAGE:
    return package()
  raise AttributeError(f"module {__name__} has no attribute {name}")
