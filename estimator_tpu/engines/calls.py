"""How an engine calls a program's model_fn: with the arguments its signature names."""

import inspect


def call_model_fn(model_fn, features, labels, mode, params, config=None):
  """Calls model_fn with the arguments its signature names, as TPUEstimator does."""
  accepted = inspect.signature(model_fn).parameters
  kwargs = {"params": params}
  for name, value in (("labels", labels), ("mode", mode), ("config", config)):
    if name in accepted:
      kwargs[name] = value
  return model_fn(features, **kwargs)
