"""`python -m estimator_tpu.compat check PROGRAM.py ...`: what a legacy program needs, read not run.

Each file is parsed (ast), never imported. Every `tf.*` / `tf.contrib.*` name it
uses, through whatever alias (`import tensorflow as tf`,
`from estimator_tpu.compat import tf`, `from tensorflow.contrib import tpu as
contrib_tpu`, `from tensorflow.contrib.tpu.python.tpu import async_checkpoint`),
and every `tensorflow...` import gets a status: mapped, re-implemented,
refused (with what to use instead) or unknown. `tf.X` outside tf.contrib counts
as mapped when the installed TensorFlow's tf.compat.v1 has it; a `tensorflow...`
module path counts as mapped whenever it imports.

A TF 2 program is checked against `estimator_tpu.compat.tf2`, never as TF 1:
one that imports it, and one with `import tensorflow as tf` that uses no name
only TF 1 had (tf.Session, tf.placeholder, tf.layers, ...) and uses tf.estimator
or a name only TF 2 has. Its verdict names the line to change.

Also reported: a class that subclasses a TF layer and overrides one of the
private hooks whose signature changed (estimator_tpu.compat.layer_hooks adapts
the call), and a refused name that is used only inside an `if` (the program
runs as long as that branch is not taken).
"""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import types

from estimator_tpu.compat import _lazy
from estimator_tpu.compat import layer_hooks
from estimator_tpu.compat import module_paths
from estimator_tpu.compat import registry

UNKNOWN = "unknown"
FAILING = (_lazy.REFUSED, UNKNOWN)
ADAPTED = "adapted"
TF2 = "tf2"  # the alias a TF 2 program's `tf` is checked as
# Modules whose import binds the TF 1 `tf`.
TF_MODULES = ("tensorflow", "tensorflow.compat.v1")


@dataclasses.dataclass(frozen=True)
class Use:
  line: int
  name: str  # as TF 1 spells it: tf.contrib.tpu.TPUEstimator, tensorflow.contrib.summary
  status: str
  note: str = ""
  condition: str = ""  # the innermost `if` test (source) the use sits under, if any


def _contrib_status(parts):
  """(status, note) of tf.contrib.<parts...>; a module path's names count as their entries."""
  entries, rest = registry.CONTRIB, parts
  for i in range(len(parts), 0, -1):
    prefix = ".".join(parts[:i])
    if prefix in registry.MODULE_PATHS:
      entries, rest = registry.module_path_entries(prefix), parts[i:]
      break
    if registry.rule_homes(prefix):
      try:
        module = module_paths.by_rule(f"{module_paths.CONTRIB}.{prefix}", prefix)
      except ImportError:
        continue
      if not _resolves(module, parts[i:]):
        return UNKNOWN, f"{module.__name__} has no {'.'.join(parts[i:])}"
      return _lazy.MAPPED, f"module path: {module.__name__}"
    if prefix in module_paths._PACKAGES_ON_THE_WAY:
      if i == len(parts):
        return _lazy.MAPPED, "module path"
      return UNKNOWN, ""
  for i, name in enumerate(rest):
    entry = entries.get(name)
    if entry is None:
      return UNKNOWN, ""
    if not isinstance(entry, dict) and entry.kind != _lazy.REFUSED and rest[i + 1:]:
      value = _lazy.load(entry.target)  # a mapped module (tf.contrib.slim): its names
      if isinstance(value, types.ModuleType) and not _resolves(value, rest[i + 1:]):
        return UNKNOWN, f"{value.__name__} has no {'.'.join(rest[i + 1:])}"
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
  if parts[:3] == ["compat", "v1", "estimator"]:  # the same API as tf.estimator (tf_standins)
    parts = parts[2:]
  if parts[0] == "estimator" and parts[1:2] and parts[1].startswith("BoostedTrees"):
    return _lazy.REFUSED, importlib.import_module("estimator_tpu.compat.tf2").BOOSTED_TREES.format(
        name=parts[1])
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


def _tf2_status(parts):
  """(status, note) of tf.<parts...> against `estimator_tpu.compat.tf2` (TF 2 and its estimator)."""
  value = importlib.import_module("estimator_tpu.compat.tf2")
  for name in parts:
    if not isinstance(value, types.ModuleType):
      break
    try:
      value = getattr(value, name)
    except AttributeError as err:
      if name.startswith("BoostedTrees"):
        return _lazy.REFUSED, str(err)
      version = importlib.import_module("tensorflow").__version__
      return UNKNOWN, f"not in TF {version} nor its estimator"
  return _lazy.MAPPED, "tf2"


def name_status(name):
  """(status, note) of a TF 1 name: tf.x.y, tf.contrib.x.y or tensorflow.x.y (a module path).

  A name under `tf2.` is a TF 2 program's, checked against estimator_tpu.compat.tf2.
  """
  parts = name.split(".")
  if parts[0] == TF2:
    return _tf2_status(parts[1:])
  if parts[0] == "tensorflow":
    parts[0] = "tf"
    if parts[1:2] == ["python"]:
      return _moved_status(name)
    if parts[1:2] != ["contrib"]:
      status = _moved_status(name)
      if status[0] == _lazy.MAPPED:
        return status  # a real module (tensorflow.core.protobuf...), or a name in one
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


# Keras' layer classes, as a program names them: a subclass's private hooks are checked.
_LAYER_BASES = (".layers.", ".keras.layers.")


def _dotted(node, aliases):
  """`a.b.c` of an expression whose root is an alias, as the alias's TF name; None if not."""
  chain, base = [], node
  while isinstance(base, ast.Attribute):
    chain.append(base.attr)
    base = base.value
  if not (isinstance(base, ast.Name) and base.id in aliases):
    return None
  names = []
  for name in reversed(chain):
    if name.startswith("__"):  # tf.train.Optimizer.__init__: the name is tf.train.Optimizer
      break
    names.append(name)
  return ".".join([aliases[base.id], *names])


def _parameters(function):
  """inspect.Parameter list of an ast function, without its first (self)."""
  args = function.args
  kind = inspect.Parameter
  params = [kind(a.arg, kind.POSITIONAL_ONLY) for a in args.posonlyargs]
  params += [kind(a.arg, kind.POSITIONAL_OR_KEYWORD) for a in args.args]
  if args.vararg:
    params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
  params += [kind(a.arg, kind.KEYWORD_ONLY) for a in args.kwonlyargs]
  if args.kwarg:
    params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
  return params[1:]


class _Reader(ast.NodeVisitor):
  """Collects the TF names one module uses, following its import aliases."""

  def __init__(self):
    self.aliases = {}  # local name -> TF 1 dotted name it stands for
    self.names = []  # (line, TF name, condition)
    self.overrides = []  # (line, "Class._hook (base)", note)
    self.plain_tf = False  # `tf` is `import tensorflow as tf`
    self.tf2 = False  # `from estimator_tpu.compat import tf2`
    self._conditions = []
    self._layer_classes = set()

  def _add(self, node, name):
    self.names.append((node.lineno, name, self._conditions[-1] if self._conditions else ""))

  def visit_If(self, node):
    test = ast.unparse(node.test)
    self.visit(node.test)
    for branch, condition in ((node.body, test), (node.orelse, f"not ({test})")):
      self._conditions.append(condition)
      for child in branch:
        self.visit(child)
      self._conditions.pop()

  def visit_Import(self, node):
    for alias in node.names:
      if alias.name == "tensorflow" or alias.name.startswith("tensorflow."):
        local = alias.asname or alias.name.split(".")[0]
        bound = alias.name if alias.asname else "tensorflow"
        self.aliases[local] = "tf" if bound in TF_MODULES else bound
        self.plain_tf |= bound == "tensorflow" and local == "tf"
        if alias.name not in TF_MODULES:
          self._add(node, alias.name)

  def visit_ImportFrom(self, node):
    module = node.module or ""
    for alias in node.names:
      local = alias.asname or alias.name
      if module == "estimator_tpu.compat" and alias.name == "tf":
        self.aliases[local] = "tf"
      elif module == "estimator_tpu.compat" and alias.name == TF2:
        self.aliases[local] = TF2
        self.tf2 = True
      elif module == "tensorflow.compat" and alias.name == "v1":
        self.aliases[local] = "tf"
      elif module == "tensorflow" or module.startswith("tensorflow."):
        full = f"{module}.{alias.name}"
        self.aliases[local] = full
        self._add(node, full)

  def visit_ClassDef(self, node):
    bases = [_dotted(base, self.aliases) or (base.id if isinstance(base, ast.Name) else "")
             for base in node.bases]
    layer_base = next((b for b in bases if any(part in f".{b}." for part in _LAYER_BASES)
                       or b in self._layer_classes), None)
    if layer_base:
      self._layer_classes.add(node.name)
      for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name in layer_hooks.HOOKS:
          missing = layer_hooks.missing_arguments(_parameters(item), item.name)
          if missing:
            dropped = ", ".join(f"{added.name}=" if added.keyword else added.name
                                for added in missing)
            self.overrides.append((item.lineno, f"{node.name}.{item.name} ({layer_base})",
                                   f"TF 1 signature; Keras now passes {dropped}, which "
                                   f"estimator_tpu.compat drops for it (layer_hooks)"))
    self.generic_visit(node)

  def visit_Attribute(self, node):
    name = _dotted(node, self.aliases)
    if name is None:
      self.generic_visit(node)
    elif name != self.aliases.get(getattr(node.value, "id", None)):
      self._add(node, name)  # the inner attributes are prefixes of this one


def _resolves(root, parts):
  """Whether root.<parts...> exists (attributes of modules only)."""
  value = root
  for name in parts:
    if not isinstance(value, types.ModuleType):
      return True
    try:
      value = getattr(value, name)
    except AttributeError:
      return False
  return True


def is_tf2_program(reader):
  """Whether a program with `import tensorflow as tf` is TF 2 code (see the module docstring)."""
  if not reader.plain_tf:
    return False
  tf_names = [name.split(".")[1:] for _, name, _ in reader.names if name.startswith("tf.")]
  if any(parts[:1] == ["contrib"] for parts in tf_names):
    return False
  v1 = importlib.import_module("tensorflow.compat.v1")
  tf2 = importlib.import_module("estimator_tpu.compat.tf2")
  in_v1 = [_resolves(v1, parts) for parts in tf_names]
  in_v2 = [_resolves(tf2, parts) for parts in tf_names]
  if any(a and not b for a, b in zip(in_v1, in_v2)):
    return False  # a name only TF 1 had: TF 1 code
  return any(b and not a for a, b in zip(in_v1, in_v2)) or any(
      parts[:1] == ["estimator"] for parts in tf_names)


def read_file(path):
  """([Use] of one file in line order, is_tf2); raises OSError or SyntaxError."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  reader = _Reader()
  reader.visit(tree)
  tf2 = reader.tf2 or is_tf2_program(reader)
  uses = set()
  for line, name, condition in reader.names:
    checked = f"{TF2}{name[2:]}" if tf2 and name.startswith("tf.") else name
    status, note = name_status(checked)
    shown = f"tf{name[len(TF2):]}" if name.startswith(TF2 + ".") else name
    uses.add(Use(line, shown, status, note, condition))
  for line, name, note in reader.overrides:
    uses.add(Use(line, name, ADAPTED, note))
  return sorted(uses, key=lambda use: (use.line, use.name)), tf2


def verdict(path, uses, tf2=False):
  counts = {kind: sum(use.status == kind for use in uses)
            for kind in (*_lazy.KINDS, UNKNOWN, ADAPTED)}
  summary = ", ".join(f"{count} {kind}" for kind, count in counts.items())
  failing = [use for use in uses if use.status in FAILING]
  line = ("`from estimator_tpu.compat import tf2 as tf`" if tf2
          else "`from estimator_tpu.compat import tf`")
  kind = "a TF 2 program" if tf2 else "TF 1 code"
  if not failing:
    outcome = "runs with only its import line changed"
  elif all(use.condition for use in failing):
    conditions = sorted({f"`{use.condition}` (line {use.line})" for use in failing})
    outcome = ("runs with only its import line changed as long as it takes no branch "
               "under " + ", ".join(conditions))
  else:
    outcome = "needs changes before it runs"
  return f"{path}: {len(uses)} TF names ({summary}), {kind} (for {line}): {outcome}"


def main(paths, out=print):
  """Prints each file's uses and verdict; returns 0, or 1 if any is refused or unknown."""
  status = 0
  for path in paths:
    try:
      uses, tf2 = read_file(path)
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
      elif use.status in (_lazy.REIMPLEMENTED, ADAPTED):
        note = f"  ({use.note})"
      elif use.status == UNKNOWN:
        note = f"  ({use.note or 'see ' + _lazy.MIGRATING_DOC})"
      if use.condition and use.status in FAILING:
        note += f"  [only under `if {use.condition}`]"
      out(f"{path}:{use.line}: {use.name}  {use.status}{note}")
    out(verdict(path, uses, tf2))
    if any(use.status in FAILING and not use.condition for use in uses):
      status = 1
  return status
