"""Lazy namespaces behind `estimator_tpu.compat.tf`: names resolve on first use."""

import collections
import importlib
import types

MIGRATING_DOC = "docs/MIGRATING.md"
# The estimator's TF 1 API (what tf.compat.v1.estimator was on TF 2.15): its names
# carry no "deprecated, use tf.compat.v1..." message, unlike the TF 2 API's.
ESTIMATOR_V1 = "tensorflow_estimator._api.v1.estimator"
# The tf-slim package, reached through the module that supplies the TF names it needs.
SLIM = "estimator_tpu.compat.slim"

MAPPED = "mapped"
REIMPLEMENTED = "re-implemented"
REFUSED = "refused"
KINDS = (MAPPED, REIMPLEMENTED, REFUSED)

# kind: one of KINDS; target: "package.module:attr.path" (None when refused);
# note: what changed in behaviour, or for a refused name what to use instead.
Entry = collections.namedtuple("Entry", ["kind", "target", "note"])


def mapped(target, note=""):
  """A name whose TF 2 home behaves as the TF 1 original did."""
  return Entry(MAPPED, target, note)


def reimplemented(target, note):
  """A name TF 2 removed or changed, implemented here faithfully."""
  return Entry(REIMPLEMENTED, target, note)


def refused(instead):
  """A name TF 2 has in no form; `instead` says what to use."""
  return Entry(REFUSED, None, instead)


def load(target):
  """Imports `target` ("package.module:attr.path") and returns the object."""
  module_name, _, attr_path = target.partition(":")
  value = importlib.import_module(module_name)
  if module_name == ESTIMATOR_V1:
    importlib.import_module("estimator_tpu.compat.activation").quiet_api_modules(ESTIMATOR_V1)
  for part in filter(None, attr_path.split(".")):
    value = getattr(value, part)
  return value


def display_target(target):
  """How a target reads in docs: `tf.x.y` for public TF, a dotted path else."""
  module_name, _, attr_path = target.partition(":")
  if module_name == "tensorflow":
    return "tf." + attr_path
  if module_name == ESTIMATOR_V1:
    return "tf.compat.v1.estimator." + attr_path
  if module_name == SLIM:
    return attr_path
  return ".".join(filter(None, [module_name, attr_path]))


def refused_message(path, instead):
  return (f"{path} is not available in TF 2 and estimator_tpu.compat does "
          f"not provide it: {instead} (see {MIGRATING_DOC}).")


def unknown_message(path):
  return (f"{path} is not provided by estimator_tpu.compat: TF 2 has no "
          f"tf.contrib. Look up its TF 2 replacement in {MIGRATING_DOC}, or use "
          f"the tf.compat.v1 / tf.* name directly.")


def module_name(path):
  """The module a namespace is importable as: tf.contrib.tpu -> tensorflow.contrib.tpu."""
  return "tensorflow" + path[len("tf"):] if path.startswith("tf.") else path


class Namespace(types.ModuleType):
  """A `tf.contrib.*` namespace whose attributes come from a registry dict.

  A dict value is a child namespace; an `Entry` is resolved on first access
  and cached. Refused and unknown names raise AttributeError with a message
  that says what to use instead, naming the path as the code wrote it
  (`tf.contrib.x`, or `tensorflow.contrib.x` imported by module path);
  `__name__` is the module name `import tensorflow.contrib...` finds it under.
  """

  def __init__(self, path, entries):
    super().__init__(module_name(path), f"Compatibility namespace for {path}.")
    self.__dict__["_path"] = path
    self.__dict__["_entries"] = entries

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    path = f"{self._path}.{name}"
    entry = self._entries.get(name)
    if entry is None:
      raise AttributeError(unknown_message(path))
    if isinstance(entry, dict):
      value = Namespace(path, entry)
    elif entry.kind == REFUSED:
      raise AttributeError(refused_message(path, entry.note))
    else:
      value = load(entry.target)
    self.__dict__[name] = value
    return value

  def __setattr__(self, name, value):
    # Importing `<this>.<name>` as a module (by a MODULE_RULES path) must not replace the
    # registry's object for `name`: TF 1.15's packages star-imported their modules' names,
    # so `from tensorflow.contrib.framework.python.ops import arg_scope` is the function.
    if isinstance(value, types.ModuleType) and isinstance(self._entries.get(name), Entry):
      return
    super().__setattr__(name, value)

  def __dir__(self):
    return sorted(name for name, entry in self._entries.items()
                  if isinstance(entry, dict) or entry.kind != REFUSED)


class Overlay(types.ModuleType):
  """A `tf.compat.v1` module whose names are its own but for the registry's `entries`.

  A dict entry overlays a child module the same way; an `Entry` replaces the
  name (TF 1.15's behaviour where TF 2's differs). Every other attribute is
  the module's own.
  """

  def __init__(self, module, entries):
    super().__init__(module.__name__, module.__doc__)
    self.__dict__["_module"] = module
    self.__dict__["_entries"] = entries

  def __getattr__(self, name):
    entry = self._entries.get(name)
    value = getattr(self._module, name)
    if isinstance(entry, dict):
      value = Overlay(value, entry)
    elif entry is not None:
      value = load(entry.target)
    self.__dict__[name] = value
    return value

  def __dir__(self):
    return dir(self._module)


class CompatTF(types.ModuleType):
  """`tf.compat.v1` with a `tf.contrib` namespace on top.

  Any attribute other than `contrib` falls through to `tensorflow.compat.v1`,
  imported on first use so that importing this module stays cheap; the
  modules named in `overlays` with a few of their names as TF 1.15 had them.
  """

  def __init__(self, contrib_entries, overlays=None):
    super().__init__("estimator_tpu.compat.tf", CompatTF.__doc__)
    self.__dict__["_contrib_entries"] = contrib_entries
    self.__dict__["_overlays"] = overlays or {}

  def __getattr__(self, name):
    if name.startswith("__") and name != "__version__":
      raise AttributeError(name)
    importlib.import_module("estimator_tpu.compat.activation").activate()
    if name == "contrib":
      value = Namespace("tf.contrib", self._contrib_entries)
    elif name == "estimator":
      # TF >= 2.16 has no tf.estimator: the estimator package's TF 1 namespace.
      importlib.import_module("estimator_tpu.stacks")  # the stand-ins it needs on TF >= 2.16
      value = importlib.import_module(ESTIMATOR_V1)
      importlib.import_module("estimator_tpu.compat.activation").quiet_api_modules(ESTIMATOR_V1)
    elif name in self._overlays:
      value = Overlay(_v1_attribute(name), self._overlays[name])
    else:
      value = _v1_attribute(name)
    setattr(self, name, value)
    return value

  def __dir__(self):
    return sorted(set(dir(importlib.import_module("tensorflow.compat.v1")))
                  | {"contrib", "estimator"})


def _v1_attribute(name):
  v1 = importlib.import_module("tensorflow.compat.v1")
  try:
    return getattr(v1, name)
  except AttributeError:
    raise AttributeError(
        f"tf.{name} is not in tf.compat.v1 of TF {v1.__version__}; look for it under "
        f"tf.compat.v2 or in {MIGRATING_DOC}.") from None
