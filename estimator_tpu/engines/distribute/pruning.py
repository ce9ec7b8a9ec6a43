"""Part of a traced step run on its own, as a TF 1 session runs only what a fetch needs.

TF 1 ran the subgraph a `session.run(fetches)` needed and nothing else: a
metric's value op read the metric's variables without updating them, a
`FinalOpsHook` ran its ops after the last step, a `LoggingTensorHook` at
the end computed its tensors once more on the next batch. A tf.function
runs all of its stateful ops, so the engine copies the part of a traced
step graph the fetches need (as `WrappedFunction.prune` does) into a
function of its own: the variables it reads are the engine's own (followed
through the captures of the nested graphs out to their handles), and the
step's input batch, when the fetches need it, is fed.

Only data inputs are followed. A tf.function orders every read of a
variable after the writes its program made before it (automatic control
dependencies); following those edges would run the step's train op again
to read a weight. TF 1's graph had no such edges.
"""

import tensorflow as tf
from tensorflow.python.eager import lift_to_graph
from tensorflow.python.eager import wrap_function
from tensorflow.python.framework import func_graph
from tensorflow.python.util import object_identity


class NeedsStepInputsError(ValueError):
  """The fetches depend on something only a running step has (its loop counter, its iterator)."""


def outer_value(tensor):
  """The eager tensor (a variable's handle) an internal capture stands for, or None."""
  while tf.is_symbolic_tensor(tensor):
    graph = tensor.graph
    outer = None
    for external, internal in getattr(graph, "captures", ()):
      if internal is tensor:
        outer = external
        break
    if outer is None:
      return None
    tensor = outer
  return tensor


class Pruned:
  """fetches of a traced graph as a function: `pruned(feed_values)` -> the fetched values.

  Args:
    graph: the traced (Func)Graph the fetches are in.
    fetches: a structure of its tensors and operations (operations give None).
    feeds: tensors of graph whose values the caller gives (the step's batch),
      in the order `__call__` takes them.

  Raises:
    NeedsStepInputsError: a fetch depends on a placeholder that is neither a
      feed nor a capture of something outside every function.
  """

  def __init__(self, graph, fetches, feeds=()):
    self._structure = fetches
    flat = [x for x in tf.nest.flatten(fetches) if x is not None]
    self.feeds = list(feeds)
    ops, self.uses_feeds = _data_subgraph(flat, self.feeds)
    self._captured = []
    if not self.uses_feeds:
      self.feeds = []
    sources = list(self.feeds)
    for op in ops:
      if op.type != "Placeholder" or any(op is feed.op for feed in self.feeds):
        continue
      value = outer_value(op.outputs[0])
      if value is None:
        raise NeedsStepInputsError(
            f"{', '.join(_names(flat))} depend(s) on {op.name}, an input of the running step")
      sources.append(op.outputs[0])
      self._captured.append(value)
    with graph.as_default():
      pruned = func_graph.FuncGraph("pruned")
    copies = object_identity.ObjectIdentityDictionary()
    with pruned.as_default():
      for source in sources:
        lift_to_graph._copy_source(source, pruned, copies, False, {}, graph)  # pylint: disable=protected-access
      for op in sorted(ops, key=lambda op: op._id):  # pylint: disable=protected-access
        if op not in copies:
          # Control inputs are not copied (see the module's docstring).
          lift_to_graph._copy_non_source(op, pruned, copies, graph)  # pylint: disable=protected-access
    tensors = [x for x in flat if isinstance(x, tf.Tensor)]
    pruned.inputs.extend(copies[s] for s in sources)
    pruned.outputs.extend(copies[t] for t in tensors)
    pruned.control_outputs.extend(copies[x] for x in flat if isinstance(x, tf.Operation))
    for function in graph._functions.values():  # pylint: disable=protected-access
      pruned._add_function(function)  # pylint: disable=protected-access
    pruned.structured_outputs = [copies[t] for t in tensors]
    self._function = wrap_function.WrappedFunction(pruned, wrap_function.VariableHolder())
    self._function._num_positional_args = len(sources)  # pylint: disable=protected-access
    self._function._arg_keywords = [f"input_{i}" for i in range(len(sources))]  # pylint: disable=protected-access
    self._tensor_positions = [i for i, x in enumerate(tf.nest.flatten(fetches))
                              if isinstance(x, tf.Tensor)]

  def __call__(self, *feed_values):
    """The fetched values (numpy), in the fetches' structure; operations give None.

    Args:
      *feed_values: a value for each of `self.feeds` (none when the fetches
        need no feed).
    """
    outputs = self._function(*feed_values, *self._captured) or []
    flat = [None] * len(tf.nest.flatten(self._structure))
    for position, value in zip(self._tensor_positions, outputs):
      flat[position] = value.numpy()
    return tf.nest.pack_sequence_as(self._structure, flat)


def _data_subgraph(flat, feeds):
  """(the ops the fetches need through data inputs, whether they need the feeds).

  The walk stops at the feeds; the ops of the feeds are in the set only when needed.
  """
  feed_ops = {feed.op for feed in feeds}
  needed, stack = set(), [x if isinstance(x, tf.Operation) else x.op for x in flat]
  while stack:
    op = stack.pop()
    if op in needed:
      continue
    needed.add(op)
    if op not in feed_ops:
      stack.extend(tensor.op for tensor in op.inputs)
  return needed, bool(needed & feed_ops)


def _names(flat):
  return [x.name for x in flat]
