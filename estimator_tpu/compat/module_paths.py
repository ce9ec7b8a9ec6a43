"""`import tensorflow.contrib...` and moved TF-internal paths work once compat is imported.

TF 1 code imports contrib by module path as often as by attribute:
`from tensorflow.contrib import summary`,
`from tensorflow.contrib.tpu.python.tpu import async_checkpoint`,
`from tensorflow.contrib.training.python.training import evaluation`. TF 2 has
no `tensorflow.contrib` package, so these fail before the attribute mapping
gets a chance. `ModulePathFinder` answers them from the registry:

- `tensorflow.contrib` and `tensorflow.contrib.<module>` are the very
  namespaces `tf.contrib` and `tf.contrib.<module>` of `estimator_tpu.compat.tf`;
- each path of `registry.MODULE_PATHS` is a namespace holding the names that
  module held in TF 1.15, resolved through the same registry entries (so
  `async_checkpoint.AsyncCheckpointSaverHook is tf.contrib.tpu.AsyncCheckpointSaverHook`);
- any other path under a `registry.MODULE_RULES` prefix is the TF 2 module
  that holds the same objects (`tensorflow.contrib.tpu.python.tpu.tpu_function`
  is `tensorflow.python.tpu.tpu_function`);
- a refused or unknown path raises ImportError with the message the attribute
  form gives;
- `registry.MOVED_PACKAGES` paths (`tensorflow.python.estimator...`) are the
  modules of the moved package, where TensorFlow has no module of its own;
- TF 1's public modules (`tensorflow.gfile`, `tensorflow.logging`,
  `tensorflow.saved_model.loader`, ...) are tf.compat.v1's, where TensorFlow has no
  module of its own (registry.V1_API).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from estimator_tpu import _moved
from estimator_tpu import tf_standins
from estimator_tpu.compat import _lazy
from estimator_tpu.compat import registry

CONTRIB = "tensorflow.contrib"


def _packages_on_the_way():
  """The intermediate package paths of MODULE_PATHS, e.g. 'tpu.python' and 'tpu.python.tpu'."""
  packages = set()
  for relative in registry.MODULE_PATHS:
    parts = relative.split(".")
    packages.update(".".join(parts[:i]) for i in range(2, len(parts)))
  for prefix in registry.MODULE_RULES:
    parts = prefix.split(".")
    packages.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
  return packages - set(registry.MODULE_PATHS)


_PACKAGES_ON_THE_WAY = _packages_on_the_way()


def contrib_module(fullname):
  """The namespace `fullname` (tensorflow.contrib[...]) names; None if it names no module.

  Raises:
    ImportError: a refused or unknown path, with the attribute form's message.
  """
  from estimator_tpu.compat import tf
  if fullname == CONTRIB:
    return tf.contrib
  relative = fullname[len(CONTRIB) + 1:]
  if relative in registry.MODULE_PATHS:
    return _lazy.Namespace(fullname, registry.module_path_entries(relative))
  if relative in _PACKAGES_ON_THE_WAY:
    return _lazy.Namespace(fullname, {})
  parent_name, _, name = fullname.rpartition(".")
  parent = sys.modules[parent_name]  # the import system imports the parent first
  entry = getattr(parent, "_entries", {}).get(name)
  if entry is None:
    return by_rule(fullname, relative)
  if isinstance(entry, dict):
    return getattr(parent, name)  # the attribute form's own namespace object
  if entry.kind == _lazy.REFUSED:
    raise ImportError(_lazy.refused_message(fullname, entry.note))
  value = getattr(parent, name)
  if isinstance(value, types.ModuleType):
    return value  # a mapped module (tf.contrib.slim is the tf_slim package)
  if registry.rule_homes(relative):
    return by_rule(fullname, relative)  # the module of a star-imported name (arg_scope)
  return None  # a class or function, not a module: Python's own error says so


def by_rule(fullname, relative):
  """The TF 2 module MODULE_RULES give for `fullname`; ImportError naming what was tried."""
  homes = registry.rule_homes(relative)
  for home in homes:
    try:
      found = importlib.util.find_spec(home) is not None
    except ImportError:  # a parent of `home` does not exist on this TensorFlow
      found = False
    if found:
      return importlib.import_module(home)
  message = _lazy.unknown_message(fullname)
  if homes:
    message += f" (TF 2 has no {' or '.join(homes)})"
  raise ImportError(message)


def _moved_target(fullname, path):
  """The module a MOVED_PACKAGES path stands for, or None where TensorFlow has its own."""
  for old, new in registry.MOVED_PACKAGES.items():
    if fullname != old and not fullname.startswith(old + "."):
      continue
    parent_name = fullname.rpartition(".")[0]
    parent = sys.modules.get(parent_name)
    parent_is_alias = parent is not None and parent.__name__ != parent_name
    if not parent_is_alias and importlib.machinery.PathFinder.find_spec(fullname, path):
      return None  # TensorFlow's own module (TF 2.15's forwarding modules)
    target = new + fullname[len(old):]
    return target if importlib.util.find_spec(target) is not None else None
  return None


_v1_aliases = set()


def _v1_target(fullname, path):
  """`tensorflow.compat.v1.<rest>` for a TF 1 public module path `tensorflow.<rest>`, or None.

  None where TensorFlow has a module of its own there, where tf.compat.v1 has none
  (or only one this package serves, like the estimator's), and while TensorFlow
  itself is still being imported.
  """
  old, new = registry.V1_API
  if not fullname.startswith(old + ".") or fullname.split(".")[1] in registry.TF_OWN_PACKAGES:
    return None
  tensorflow = sys.modules.get(old)
  if tensorflow is None or getattr(tensorflow.__spec__, "_initializing", False):
    return None
  parent = fullname.rpartition(".")[0]
  if parent not in _v1_aliases and importlib.machinery.PathFinder.find_spec(fullname, path):
    return None
  target = new + fullname[len(old):]
  if tf_standins.estimator_alias(target) is not None:
    return None  # tf.compat.v1's estimator is this package's alias; tf.estimator stays as TF has it
  if not isinstance(_v1_attribute(target), types.ModuleType):
    return None
  _v1_aliases.add(fullname)
  return target


def _v1_attribute(target):
  """What `tf.compat.v1.<rest>` is for target `tensorflow.compat.v1.<rest>`, or None."""
  module = importlib.import_module(registry.V1_API[1])
  for part in target[len(registry.V1_API[1]) + 1:].split("."):
    module = getattr(module, part, None)
  return module


class ModulePathFinder(importlib.abc.MetaPathFinder):
  """Finds tensorflow.contrib paths, MOVED_PACKAGES paths and TF 1 public module paths."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname == CONTRIB or fullname.startswith(CONTRIB + "."):
      module = contrib_module(fullname)
      if module is None:
        return None
      return importlib.util.spec_from_loader(
          fullname, _moved.AliasLoader(lambda: module), is_package=True)
    moved = _moved_target(fullname, path)
    if moved is not None:
      return importlib.util.spec_from_loader(
          fullname, _moved.AliasLoader(lambda: importlib.import_module(moved)))
    v1 = _v1_target(fullname, path)
    if v1 is None:
      return None
    return importlib.util.spec_from_loader(
        fullname, _moved.AliasLoader(lambda: v1_module(v1)), is_package=True)


def v1_module(target):
  """The module `tf.compat.v1.<rest>` is, for target `tensorflow.compat.v1.<rest>`.

  The attribute, not importlib's module of that name: TensorFlow fills some of
  tf.compat.v1's modules after they load (tf.compat.v1.app gets `flags`), and
  some are attributes only (tf.compat.v1.flags is absl's flags).
  """
  return _v1_attribute(target)


def install():
  """Puts the finder first: a moved package's submodule must not load twice by file path."""
  if not any(isinstance(finder, ModulePathFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, ModulePathFinder())
