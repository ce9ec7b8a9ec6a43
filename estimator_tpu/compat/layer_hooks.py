"""TF 1 layer subclasses overriding a private Keras hook keep working: calls pass what they take.

TF 1 models subclassed `tf.layers.*` and overrode private methods of the Keras
layer behind it, with their TF 1.15 signatures: the cross-replica batch norm of
the TPU image models overrides `_moments(self, inputs, reduction_axes, keep_dims)`.
Keras 2.15 and tf_keras 2.21 call some of these hooks with more arguments
(`self._moments(..., keep_dims=keep_dims, mask=mask)`), and the override fails
with `TypeError: ... got an unexpected keyword argument 'mask'`.

`install()` gives Keras' base Layer an `__init_subclass__`: when a class is
defined that overrides one of HOOKS with a signature lacking the arguments
Keras now passes, that method is wrapped once so that the call drops those
arguments, for every subclass, wherever Keras calls it. A dropped argument
that TF 1.15 had no notion of must be None (a `mask` on a layer called with a
mask raises TypeError naming the class): the override could not honour it.
Hooks whose signature did not change (`_get_training_value`,
`_assign_moving_average`, `_renorm_correction_and_moments`, the v1 optimizers'
`_apply_dense`, `_assert_valid_dtypes`, ...) need nothing and get nothing.
"""

import collections
import functools
import inspect
import threading

# An argument Keras now passes to a hook that TF 1.15 did not: its name, whether it is
# passed by keyword or as the first positional one, and whether it must be None to drop.
Added = collections.namedtuple("Added", ["name", "keyword", "must_be_none"])

HOOKS = {
    # BatchNormalization: TF 1.15 (inputs, reduction_axes, keep_dims) -> + mask=.
    "_moments": (Added("mask", True, True),),
    "_calculate_mean_and_var": (Added("mask", True, True),),
    # BatchNormalization: TF 1.15 (inputs, training) -> (inputs, mask=, training=).
    "_fused_batch_norm": (Added("mask", True, True),),
    # Conv: TF 1.15 computed the causal padding from the layer alone -> (inputs).
    "_compute_causal_padding": (Added("inputs", False, False),),
}

_lock = threading.Lock()
_installed = set()


def _parameters(method):
  return list(inspect.signature(method).parameters.values())[1:]  # after self


def missing_arguments(parameters, hook):
  """The HOOKS arguments of `hook` an override cannot take, as Added; [] if none.

  Args:
    parameters: the override's inspect.Parameter list, without `self`.
    hook: a HOOKS key.
  """
  kinds = {p.kind for p in parameters}
  names = {p.name for p in parameters}
  missing = []
  for added in HOOKS[hook]:
    if added.keyword:
      takes = added.name in names or inspect.Parameter.VAR_KEYWORD in kinds
    else:
      takes = bool(parameters) and parameters[0].kind in (
          inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
          inspect.Parameter.VAR_POSITIONAL)
    if not takes:
      missing.append(added)
  return missing


def adapt(cls, hook, method):
  """`method` wrapped so that Keras' call passes only the arguments it takes."""
  try:
    missing = missing_arguments(_parameters(method), hook)
  except (TypeError, ValueError):  # no signature to read: leave it as it is
    return method
  if not missing:
    return method

  @functools.wraps(method)
  def call(self, *args, **kwargs):
    for added in missing:
      if added.keyword and added.name in kwargs:
        value = kwargs.pop(added.name)
      elif not added.keyword and args:
        value, args = args[0], args[1:]
      else:
        continue
      if value is not None and added.must_be_none:
        raise TypeError(
            f"{cls.__qualname__}.{hook} overrides Keras' hook with its TF 1 signature, "
            f"which has no {added.name!r}; this call passes {added.name}={value!r}, which "
            f"it cannot honour: accept {added.name}=None in the override")
    return method(self, *args, **kwargs)

  return call


def _adapt_subclass(cls):
  for hook in HOOKS:
    method = cls.__dict__.get(hook)
    if inspect.isfunction(method):
      setattr(cls, hook, adapt(cls, hook, method))


def install(layer_class):
  """Makes every later subclass of `layer_class` (Keras' base Layer) adapt its TF 1 hooks."""
  with _lock:
    if layer_class in _installed:
      return
    _installed.add(layer_class)
  original = layer_class.__dict__.get("__init_subclass__")

  def __init_subclass__(cls, **kwargs):
    if original is not None:
      original.__func__(cls, **kwargs)
    else:
      super(layer_class, cls).__init_subclass__(**kwargs)
    _adapt_subclass(cls)

  layer_class.__init_subclass__ = classmethod(__init_subclass__)
