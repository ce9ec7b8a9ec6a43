"""tf.contrib.training.HParams: named hyperparameters with typed overrides.

A re-implementation of the commonly used subset of TF 1.15's class: each
hyperparameter keeps the type of its first value, and `parse("a=1,b=x")`,
`set_hparam` and `override_from_dict` coerce new values to that type (ints
widen to floats; nothing narrows, and bools, numbers and strings never mix).
Not kept: `to_proto`/`from_proto` (the HParamDef proto left with tf.contrib)
and indexed assignment `parse("a[1]=2")`.
"""

import json
import numbers
import re

# name=value or name=[v1,v2,...], separated by commas.
_ASSIGNMENT = re.compile(r"""
  (?P<name>[a-zA-Z][\w\.]*)
  (?P<index>\[\s*\d+\s*\])?
  \s*=\s*
  ((?P<val>[^,\[]*) | \[(?P<vals>[^\]]*)\])
  ($|,\s*)""", re.VERBOSE)


def _cast(name, param_type, value):
  """Casts `value` to `param_type` the way TF 1's HParams allowed."""
  fail = ValueError(f"Could not cast hparam '{name}' of type "
                    f"'{param_type}' from value {value!r}")
  if type(value) is param_type:  # exact type: bool is an int, and must not pass as one
    return value
  if issubclass(param_type, type(None)):
    return value
  is_text = isinstance(value, (str, bytes))
  if issubclass(param_type, (str, bytes)) and not is_text:
    raise fail
  if issubclass(param_type, bool) != isinstance(value, bool):
    raise fail
  if (issubclass(param_type, numbers.Integral)
      and not isinstance(value, numbers.Integral)):
    raise fail
  if (issubclass(param_type, numbers.Number)
      and not isinstance(value, numbers.Number)):
    raise fail
  return param_type(value)


def _parse_bool(text):
  if text in ("true", "True"):
    return True
  if text in ("false", "False"):
    return False
  return bool(int(text))


def _parse_one(name, param_type, text, values):
  parse = _parse_bool if param_type is bool else param_type
  try:
    return parse(text)
  except ValueError:
    raise ValueError(f"Could not parse hparam '{name}' of type "
                     f"'{param_type.__name__}' with value '{text}' in "
                     f"{values}") from None


def parse_values(values, type_map):
  """Parses "a=1,b=x,c=[1,2]" into {name: value} typed by `type_map`.

  Args:
    values: the override string.
    type_map: {name: python type} of the known hyperparameters.

  Returns:
    A dict from name to parsed value (a list for `[...]` values).

  Raises:
    ValueError: malformed text, an unknown name, a repeated name, an indexed
      assignment or a value that does not parse as the parameter's type.
  """
  results, pos = {}, 0
  while pos < len(values):
    match = _ASSIGNMENT.match(values, pos)
    if not match:
      raise ValueError(f"Malformed hyperparameter value: {values[pos:]}")
    pos = match.end()
    name = match.group("name")
    if name not in type_map:
      raise ValueError(f"Unknown hyperparameter type for {name}")
    if match.group("index"):
      raise ValueError(f"Indexed assignment {match.group(0)!r} is not "
                       f"supported; give the whole list: {name}=[...]")
    if name in results:
      raise ValueError(f"Multiple assignments to variable '{name}' in {values}")
    if match.group("vals") is not None:
      items = filter(None, re.split("[ ,]", match.group("vals")))
      results[name] = [_parse_one(name, type_map[name], item, values)
                       for item in items]
    else:
      results[name] = _parse_one(name, type_map[name], match.group("val"),
                                 values)
  return results


class HParams:
  """Hyperparameters as attributes: `HParams(learning_rate=0.1, layers=[2, 3])`."""

  _HAS_DYNAMIC_ATTRIBUTES = True  # tells pytype/pylint attributes are dynamic

  def __init__(self, hparam_def=None, model_structure=None, **kwargs):
    if hparam_def is not None:
      raise ValueError("HParams(hparam_def=...) needs the HParamDef proto, "
                       "which left with tf.contrib; pass keyword arguments "
                       "or use parse_json(json_text) instead.")
    self._hparam_types = {}
    self._model_structure = model_structure
    for name, value in kwargs.items():
      self.add_hparam(name, value)

  def add_hparam(self, name, value):
    """Adds a hyperparameter; its type is fixed by `value` from now on."""
    if getattr(self, name, None) is not None:
      raise ValueError(f"Hyperparameter name is reserved: {name}")
    if isinstance(value, (list, tuple)):
      if not value:
        raise ValueError(f"Multi-valued hyperparameters cannot be empty: {name}")
      self._hparam_types[name] = (type(value[0]), True)
    else:
      self._hparam_types[name] = (type(value), False)
    setattr(self, name, value)

  def set_hparam(self, name, value):
    """Sets an existing hyperparameter, cast to its type (KeyError if unknown)."""
    param_type, is_list = self._hparam_types[name]
    if isinstance(value, list):
      if not is_list:
        raise ValueError(
            f"Must not pass a list for single-valued parameter: {name}")
      setattr(self, name, [_cast(name, param_type, v) for v in value])
    else:
      if is_list:
        raise ValueError(f"Must pass a list for multi-valued parameter: {name}.")
      setattr(self, name, _cast(name, param_type, value))

  def del_hparam(self, name):
    if hasattr(self, name):
      delattr(self, name)
      del self._hparam_types[name]

  def parse(self, values):
    """Overrides from "a=1,b=x,c=[1,2]"; returns self."""
    type_map = {name: t for name, (t, _) in self._hparam_types.items()}
    return self.override_from_dict(parse_values(values, type_map))

  def override_from_dict(self, values_dict):
    """Sets every name in `values_dict`; returns self."""
    for name, value in values_dict.items():
      self.set_hparam(name, value)
    return self

  def set_model_structure(self, model_structure):
    self._model_structure = model_structure

  def get_model_structure(self):
    return self._model_structure

  def to_json(self, indent=None, separators=None, sort_keys=False):
    """The values as JSON (callables left out)."""
    values = {k: v for k, v in self.values().items() if not callable(v)}
    return json.dumps(values, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def parse_json(self, values_json):
    """Overrides from a JSON object string; returns self."""
    return self.override_from_dict(json.loads(values_json))

  def values(self):
    """A dict {name: value} of every hyperparameter."""
    return {name: getattr(self, name) for name in self._hparam_types}

  def get(self, key, default=None):
    """The value of `key`, or `default` (which must fit the type) if absent."""
    if key not in self._hparam_types:
      return default
    if default is not None:
      self._check_default(key, default)
    return getattr(self, key)

  def _check_default(self, key, default):
    param_type, is_list = self._hparam_types[key]
    type_text = f"list<{param_type}>" if is_list else str(param_type)
    fail = (f"Hparam '{key}' of type '{type_text}' is incompatible with "
            f"default={default}")
    if is_list != isinstance(default, list):
      raise ValueError(fail)
    try:
      for value in default if is_list else [default]:
        _cast(key, param_type, value)
    except ValueError as e:
      raise ValueError(f"{fail}. {e}") from None

  def __contains__(self, key):
    return key in self._hparam_types

  def __str__(self):
    return str(sorted(self.values().items()))

  def __repr__(self):
    return f"{type(self).__name__}({self})"
