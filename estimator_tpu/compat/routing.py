"""Every way a program reaches TPUEstimator reaches the engine ESTIMATOR_TPU_ENGINE names.

Programs reach TensorFlow's TPUEstimator class by many paths:
`tf.contrib.tpu.TPUEstimator`, `tf.estimator.tpu`, `tf.compat.v1.estimator.tpu`,
`tensorflow.compat.v1.estimator.tpu`, `tensorflow.contrib.tpu.python.tpu.
tpu_estimator`, `tensorflow_estimator.python.estimator.tpu.tpu_estimator`
imported before or after the compat layer, and their own subclasses of any of
these. All are one class object, so the choice is made there, once: when
`estimator_tpu.compat` is imported, TensorFlow's TPUEstimator (now, or when
its module is first imported) has its construction routed through
engines/choose.py's `program_engine`:

- `estimator`: the class is constructed as TensorFlow wrote it, and one line
  names the engine;
- `distribute`: the class constructed is compat/engine.py's
  EngineTPUEstimator, or for a program's subclass that subclass with the engine
  beneath it (`routed_class`), which takes the same arguments;
- TPUEstimator classes of this package (train.py's, chosen by `--engine`) are
  left as they are.
"""

import importlib.abc
import importlib.machinery
import inspect
import sys

TPU_ESTIMATOR_MODULE = "tensorflow_estimator.python.estimator.tpu.tpu_estimator"
_tensorflows = {}  # TPUEstimator's own __init__, once routed


def install():
  """Routes TPUEstimator now if its module is loaded, else when it is imported."""
  module = sys.modules.get(TPU_ESTIMATOR_MODULE)
  if module is not None:
    route(module)
  elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def route(module):
  """Makes module.TPUEstimator choose its engine when constructed (once)."""
  cls = module.TPUEstimator
  if "init" in _tensorflows:
    return
  # A plain Estimator built by the program says what runs it (plain_estimator.py).
  from estimator_tpu.compat import plain_estimator  # pylint: disable=import-outside-toplevel
  plain_estimator.watch(module.estimator_lib.Estimator, cls)
  _tensorflows["init"] = cls.__init__
  cls.__new__ = staticmethod(_new)
  cls.__init__ = _init


def tensorflows_init(estimator, *args, **kwargs):
  """TensorFlow's own TPUEstimator.__init__, without the engine's line."""
  _tensorflows["init"](estimator, *args, **kwargs)


def _new(cls, *args, **kwargs):
  from estimator_tpu.compat import engine  # pylint: disable=import-outside-toplevel
  if not issubclass(cls, engine.EngineTPUEstimator) and _chosen(cls, args, kwargs) in (
      "distribute", "jax"):
    # A program may build its TPUEstimator before it first uses `tf`: the process is set
    # up for TF 1 now, before the engine enters its eager context.
    from estimator_tpu.compat import activation  # pylint: disable=import-outside-toplevel
    activation.activate()
    cls = engine.routed_class(cls)
  return object.__new__(cls)


def _init(self, *args, **kwargs):
  from estimator_tpu.compat import engine  # pylint: disable=import-outside-toplevel
  if isinstance(self, engine.EngineTPUEstimator):  # TPUEstimator.__init__(self, ...) by name
    engine.EngineTPUEstimator.__init__(self, *args, **kwargs)
    return
  tensorflows_init(self, *args, **kwargs)
  if _program_class(type(self)):
    from estimator_tpu.run import loop  # pylint: disable=import-outside-toplevel
    on_tpu = getattr(getattr(self, "_ctx", None), "_use_tpu", False)
    loop.say(f"engine: estimator (TPUEstimator on {'TPU' if on_tpu else 'CPU/GPU'})")


def _chosen(cls, args, kwargs):
  from estimator_tpu.engines import choose  # pylint: disable=import-outside-toplevel
  if not _program_class(cls):
    return "estimator"
  return choose.program_engine(_use_tpu(cls, args, kwargs))


def _program_class(cls):
  """Whether a program wrote cls (or uses TPUEstimator itself), not this package."""
  return not cls.__module__.startswith("estimator_tpu.")


def _use_tpu(cls, args, kwargs):
  """The use_tpu a TPUEstimator construction gives; None where the class's own __init__ decides."""
  if cls.__init__ is not _init:
    return None
  try:
    bound = inspect.signature(_tensorflows["init"]).bind(None, *args, **kwargs)
  except TypeError:
    return None  # TensorFlow's __init__ says what is wrong, as it would have
  return bound.arguments.get("use_tpu", True)


class _Loader(importlib.abc.Loader):
  """The module's own loader; routes TPUEstimator once the module has run."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    route(module)

  def __getattr__(self, name):  # get_source, get_code, ... of the file's loader
    return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
  """Finds TPU_ESTIMATOR_MODULE where Python would, with _Loader around its loader."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != TPU_ESTIMATOR_MODULE:
      return None
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
      spec.loader = _Loader(spec.loader)
    return spec
