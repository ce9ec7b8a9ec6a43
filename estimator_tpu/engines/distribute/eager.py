"""The engine's own eager context: a TF 1 program keeps graph mode around the distribute engine.

Under `estimator_tpu.compat` a program runs in TF 1's graph mode (its
top-level `tf.placeholder`, `tf.Session`, `tf.summary.FileWriter`, `Saver`
work as written), while the engine's strategies, variables and tf.functions
need eager execution. The engine enters TensorFlow's own eager context
(`context.eager_mode()`, thread-local) around all it does for the program and
leaves it when it hands control back: when a method returns and at every
yield of the generator `predict()` returns. Inside, TF 1's switches stay as
the program set them (TensorShape v1; tf.functions use control flow v2 and
the engine makes resource variables whatever `tf.compat.v1.disable_v2_behavior()`
said), and inside the engine's input graph (engines/distribute/inputs.py)
graph mode is back for the input_fn.
"""

import functools
import inspect

from tensorflow.python.eager import context

eager_mode = context.eager_mode


def eagerly(fn):
  """fn run in the eager context; a generator it returns yields each item from inside it too."""

  @functools.wraps(fn)
  def run(*args, **kwargs):
    with eager_mode():
      result = fn(*args, **kwargs)
    if inspect.isgenerator(result):
      return _eager_generator(result)
    return result

  return run


def _eager_generator(generator):
  """Runs each step of generator in the eager context; the caller's mode between steps."""
  try:
    while True:
      with eager_mode():
        try:
          item = next(generator)
        except StopIteration:
          return
      yield item
  finally:
    with eager_mode():
      generator.close()
