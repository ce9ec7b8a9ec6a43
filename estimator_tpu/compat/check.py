"""`python -m estimator_tpu.compat check PROGRAM.py ...`: what a legacy program needs, read not run.

Each file is parsed (ast), never imported. Every `tf.*` / `tf.contrib.*` name it
uses, through whatever alias (`import tensorflow as tf`,
`from estimator_tpu.compat import tf`, `from tensorflow.contrib import tpu as
contrib_tpu`, `from tensorflow.contrib.tpu.python.tpu import async_checkpoint`),
and every `tensorflow...` import gets a status: mapped, re-implemented,
refused (with what to use instead) or unknown. `tf.X` outside tf.contrib counts
as mapped when the installed TensorFlow's tf.compat.v1 has it.
"""

import ast
import dataclasses
import importlib
import importlib.util
import types

from estimator_tpu.compat import _lazy
from estimator_tpu.compat import module_paths
from estimator_tpu.compat import registry

UNKNOWN = "unknown"
FAILING = (_lazy.REFUSED, UNKNOWN)
# Modules whose import binds the TF 1 `tf`.
TF_MODULES = ("tensorflow", "tensorflow.compat.v1")


@dataclasses.dataclass(frozen=True)
class Use:
  line: int
  name: str  # as TF 1 spells it: tf.contrib.tpu.TPUEstimator, tensorflow.contrib.summary
  status: str
  note: str = ""


def _contrib_status(parts):
  """(status, note) of tf.contrib.<parts...>; a module path's names count as their entries."""
  entries, rest = registry.CONTRIB, parts
  for i in range(len(parts), 0, -1):
    prefix = ".".join(parts[:i])
    if prefix in registry.MODULE_PATHS:
      entries, rest = registry.module_path_entries(prefix), parts[i:]
      break
    if prefix in module_paths._PACKAGES_ON_THE_WAY:
      if i == len(parts):
        return _lazy.MAPPED, "module path"
      return UNKNOWN, ""
  for name in rest:
    entry = entries.get(name)
    if entry is None:
      return UNKNOWN, ""
    if not isinstance(entry, dict):
      if entry.kind == _lazy.REIMPLEMENTED:
        return entry.kind, _lazy.display_target(entry.target)
      return entry.kind, entry.note
    entries = entry
  return _lazy.MAPPED, "namespace"


def _v1_status(parts):
  """(status, note) of tf.<parts...> outside tf.contrib, against the installed TensorFlow."""
  if not parts:
    return _lazy.MAPPED, ""
  if parts[0] == "estimator":
    importlib.import_module("estimator_tpu.stacks")
    value, parts = importlib.import_module(_lazy.ESTIMATOR_V1), parts[1:]
  else:
    value = importlib.import_module("tensorflow.compat.v1")
  for name in parts:
    if not isinstance(value, types.ModuleType):
      break  # an attribute of a class or function: not a name TF exports
    try:
      value = getattr(value, name)
    except AttributeError:
      version = importlib.import_module("tensorflow").__version__
      return UNKNOWN, f"not in tf.compat.v1 of TF {version}"
  return _lazy.MAPPED, "tf.compat.v1"


def name_status(name):
  """(status, note) of a TF 1 name: tf.x.y, tf.contrib.x.y or tensorflow.x.y (a module path)."""
  parts = name.split(".")
  if parts[0] == "tensorflow":
    parts[0] = "tf"
    if parts[1:2] == ["python"]:
      return _moved_status(name)
  if parts[1:2] == ["contrib"]:
    return _contrib_status(parts[2:])
  return _v1_status(parts[1:])


def _moved_status(name):
  """(status, note) of tensorflow.python...: the longest importable module, then attributes.

  Imports go through ModulePathFinder, so a moved package's path (TF 2.21's
  missing tensorflow.python.estimator) counts where its new home has the module.
  """
  parts = name.split(".")
  for i in range(len(parts), 2, -1):
    try:
      value = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      if not hasattr(value, attr):
        return UNKNOWN, f"{'.'.join(parts[:i])} has no {attr}"
      value = getattr(value, attr)
    return _lazy.MAPPED, "TF-internal module"
  return UNKNOWN, "no such module"


class _Reader(ast.NodeVisitor):
  """Collects the TF names one module uses, following its import aliases."""

  def __init__(self):
    self.aliases = {}  # local name -> TF 1 dotted name it stands for
    self.uses = []

  def _add(self, node, name):
    self.uses.append(Use(node.lineno, name, *name_status(name)))

  def visit_Import(self, node):
    for alias in node.names:
      if alias.name == "tensorflow" or alias.name.startswith("tensorflow."):
        local = alias.asname or alias.name.split(".")[0]
        bound = alias.name if alias.asname else "tensorflow"
        self.aliases[local] = "tf" if bound in TF_MODULES else bound
        if alias.name not in TF_MODULES:
          self._add(node, alias.name)

  def visit_ImportFrom(self, node):
    module = node.module or ""
    for alias in node.names:
      local = alias.asname or alias.name
      if module == "estimator_tpu.compat" and alias.name == "tf":
        self.aliases[local] = "tf"
      elif module == "tensorflow.compat" and alias.name == "v1":
        self.aliases[local] = "tf"
      elif module == "tensorflow" or module.startswith("tensorflow."):
        full = f"{module}.{alias.name}"
        self.aliases[local] = full
        self._add(node, full)

  def visit_Attribute(self, node):
    chain, base = [], node
    while isinstance(base, ast.Attribute):
      chain.append(base.attr)
      base = base.value
    if isinstance(base, ast.Name) and base.id in self.aliases:
      names = []
      for name in reversed(chain):
        if name.startswith("__"):  # tf.train.Optimizer.__init__: the name is tf.train.Optimizer
          break
        names.append(name)
      if names:
        self._add(node, ".".join([self.aliases[base.id], *names]))
      return  # the inner attributes are prefixes of this one
    self.generic_visit(node)


def read_file(path):
  """[Use] of one file, in line order; raises OSError or SyntaxError."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  reader = _Reader()
  reader.visit(tree)
  return sorted(set(reader.uses), key=lambda use: (use.line, use.name))


def verdict(path, uses):
  counts = {kind: sum(use.status == kind for use in uses) for kind in (*_lazy.KINDS, UNKNOWN)}
  summary = ", ".join(f"{count} {kind}" for kind, count in counts.items())
  failing = counts[_lazy.REFUSED] + counts[UNKNOWN]
  outcome = ("needs changes before it runs" if failing
             else "runs with only its import line changed")
  return f"{path}: {len(uses)} TF names ({summary}): {outcome}"


def main(paths, out=print):
  """Prints each file's uses and verdict; returns 0, or 1 if any is refused or unknown."""
  status = 0
  for path in paths:
    try:
      uses = read_file(path)
    except OSError as err:
      out(f"{path}: cannot read: {err.strerror}")
      status = 1
      continue
    except SyntaxError as err:
      out(f"{path}:{err.lineno}: cannot parse: {err.msg}")
      status = 1
      continue
    for use in uses:
      note = ""
      if use.status == _lazy.REFUSED:
        note = f"  instead: {use.note}"
      elif use.status == _lazy.REIMPLEMENTED:
        note = f"  ({use.note})"
      elif use.status == UNKNOWN:
        note = f"  ({use.note or 'see ' + _lazy.MIGRATING_DOC})"
      out(f"{path}:{use.line}: {use.name}  {use.status}{note}")
    out(verdict(path, uses))
    if any(use.status in FAILING for use in uses):
      status = 1
  return status
