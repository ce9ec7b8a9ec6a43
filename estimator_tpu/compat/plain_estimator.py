"""A program's plain Estimator while ESTIMATOR_TPU_ENGINE is set: one line saying what runs it.

ESTIMATOR_TPU_ENGINE chooses the engine of a program's TPUEstimator
(routing.py). A program may build a plain `tf.estimator.Estimator` (or a
canned one, e.g. `DNNClassifier`) instead, as programs whose `use_tpu=False`
path skips TPUEstimator do: the distribute and JAX engines run TPUEstimator's
contract (global batch sizes split into params['batch_size'] per replica,
TPUEstimatorSpec), which an Estimator, whose input_fn batches by itself, does
not give it. So that Estimator runs as TensorFlow wrote it, and the program
is told so in one line naming the variable, never silently.
"""

import os

_tensorflows = {}  # Estimator's own __init__, once watched


def watch(cls, tpu_estimator_class):
  """Makes Estimator class cls say what runs it when a program builds one (once)."""
  if "init" in _tensorflows:
    return
  _tensorflows["init"] = cls.__init__

  def __init__(self, *args, **kwargs):  # noqa: N807 -- Estimator's own
    _tensorflows["init"](self, *args, **kwargs)
    if not isinstance(self, tpu_estimator_class) and _program_built(type(self)):
      line = engine_line(type(self).__name__)
      if line:
        from estimator_tpu.run import loop  # pylint: disable=import-outside-toplevel
        loop.say(line)

  cls.__init__ = __init__


def engine_line(class_name, environ=os.environ):
  """The line for a program's Estimator of class_name; None where ESTIMATOR_TPU_ENGINE is unset."""
  from estimator_tpu.engines import choose  # pylint: disable=import-outside-toplevel
  value = environ.get(choose.ENGINE_ENV, "").strip()
  if not value:
    return None
  engine = choose.chosen_engine(False, environ)
  if engine not in ("distribute", "jax"):
    return f"engine: estimator ({class_name}, from {choose.ENGINE_ENV}={value})"
  return (f"engine: estimator ({class_name}), not {engine}: {choose.ENGINE_ENV}={value} "
          f"runs TPUEstimator programs, and this {class_name} is not one (it has no global "
          "batch sizes for the engine to split over replicas); it runs as TensorFlow wrote "
          f"it. Build a TPUEstimator(use_tpu=False, train_batch_size=...) to run it on the "
          f"{engine} engine")


def _program_built(cls):
  """Not this package's own Estimators (train.py's strategy engine, exporters)."""
  return not cls.__module__.startswith("estimator_tpu.")
