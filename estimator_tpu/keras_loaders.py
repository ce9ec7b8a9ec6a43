"""TensorFlow's lazy `tf.keras` loaders, each resolved once in the importing thread, before a race.

TF >= 2.16 serves `tf.keras`, `tf.compat.v1.keras` and `tf.compat.v2.keras` through
`KerasLazyLoader`s that choose Keras 2 or 3 on first use. That first use is not
thread-safe: `_initialize` marks the loader initialized before it records the
choice, and a second thread reaching the loader in between looks the choice up
through `__getattr__`, which looks it up again, until RecursionError. Estimator
programs meet it under a multi-worker strategy: the distribute coordinator runs
each task in a thread, MirroredStrategy each replica's model_fn, and the first
`tf.compat.v1.keras.layers.DenseFeatures` (the canned estimators' input layer)
is reached by all of them at once. settle() makes every loader's choice now,
after `TF_USE_LEGACY_KERAS` is set. TF 2.15's loaders have the same first use.
"""

import sys


def _loader_type():
  module = sys.modules.get("tensorflow.python.util.lazy_loader")
  return getattr(module, "KerasLazyLoader", None)


def _initialized(loader):
  state = vars(loader)  # never the loader's __getattr__, which would choose
  # TF >= 2.16 prefixes the loader's own attributes with _tfll_; TF 2.15 does not.
  return state.get("_tfll_initialized", state.get("_initialized", False))


def unsettled():
  """The KerasLazyLoaders in TensorFlow's loaded modules that have not chosen a Keras yet."""
  loader_type = _loader_type()
  if loader_type is None:
    return []
  found = {}
  for name, module in list(sys.modules.items()):
    if module is None or not name.startswith("tensorflow"):
      continue
    for value in list(vars(module).values()):
      if isinstance(value, loader_type) and not _initialized(value):
        found[id(value)] = value
  return list(found.values())


def settle():
  """Resolves each unresolved KerasLazyLoader (which Keras, which module); returns how many.

  Choosing may import the Keras chosen, and with it TensorFlow modules holding
  more loaders: those are settled too.
  """
  count = 0
  for _ in range(10):
    loaders = unsettled()
    if not loaders:
      break
    for loader in loaders:
      loader._initialize()
    count += len(loaders)
  return count
