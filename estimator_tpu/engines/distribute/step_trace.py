"""A traced step as hooks see it: the first replica's graph, and what it carries out per step.

A MonitoredSession calls its hooks' `begin()` once the model_fn has built
the graph, with that graph as the default one: hooks look tensors up by name
there and make ops of their own (`get_global_step()`, a summary merge). Each
trace of an engine step is such a graph: `StepTrace` keeps the first
replica's (its graph, the collections the model_fn filled, the spec, the
step's input tensors), and `carried` gives, inside a later trace, the
tensors a set of fetch keys names there, so the step can return them:

- the model_fn's tensors by name (the model_fn is traced under the names
  TF 1 gave it: `model_scope` takes off the engine's own loop scope and
  keeps a MirroredStrategy's `replica_N`);
- ops a hook made after its trace (in begin()) are copied into the new
  trace, their inputs found there by name;
- the replicas after the first return stand-ins of the same kinds: the
  hooks get the first replica's values, as the Estimator under a strategy
  gives its hooks the first device's tensors.
"""

import contextlib
import itertools
import re

import tensorflow as tf
from tensorflow.python.eager import lift_to_graph
from tensorflow.python.framework import func_graph
from tensorflow.python.training import training_util
from tensorflow.python.util import object_identity

from estimator_tpu.engines.distribute import fetches as fetches_lib
from estimator_tpu.engines.distribute import pruning

_REPLICA_SCOPE = re.compile(r"(?:^|/)(replica_\d+)$")
_numbers = itertools.count()


@contextlib.contextmanager
def model_scope():
  """The model_fn's name scope as TF 1 had it: the top (or its replica's), not the engine's loop."""
  graph = tf.compat.v1.get_default_graph()
  match = _REPLICA_SCOPE.search(graph.get_name_scope())
  with graph.name_scope(match.group(1) + "/" if match else None):
    yield


def replica_id():
  """This replica's number on its worker in a strategy.run trace; 0 outside one.

  A MultiWorkerMirroredStrategy's workers each count their first replica as
  0, as a TPU's one trace is.
  """
  if tf.distribute.in_cross_replica_context():
    return 0
  value = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
  local = len(tf.distribute.get_strategy().extended.worker_devices) or 1
  return 0 if value is None else int(value) % local


class StepTrace:
  """The first replica's step graph of one trace, as the model_fn left it.

  Attributes:
    graph: the graph the model_fn was traced in.
    spec: what the model_fn returned there.
    inputs: the step's features and labels tensors there, flat.
    collections: {key: items} of the graph's collections after the model_fn.
    number: this trace's number in the process.
  """

  def __init__(self, graph, spec, inputs):
    self.number = next(_numbers)
    self.graph = graph
    self.spec = spec
    self.inputs = [t for t in tf.nest.flatten(inputs) if isinstance(t, tf.Tensor)]
    self.collections = {key: list(graph.get_collection(key))
                        for key in graph.get_all_collection_keys()}
    self._sealed = None

  def seal(self):
    """Marks the end of the trace: ops made later were made by hooks."""
    if self._sealed is None:
      self._sealed = max((op._id for op in self.graph.get_operations()), default=-1)  # pylint: disable=protected-access

  def made_after(self, op):
    return self._sealed is not None and op._id > self._sealed  # pylint: disable=protected-access

  @contextlib.contextmanager
  def as_default(self, scope=contextlib.nullcontext):
    """The graph as the default one, inside scope(), its collections as the model_fn left them.

    Collections a FuncGraph shares with the graph outside (the variables'
    lists) are put back afterwards; the others keep what hooks add.

    Args:
      scope: () -> the context the model_fn was called in (the engine's
        variable store), entered with the graph as the default one.
    """
    with self.graph.as_default(), scope():
      shared = {key: list(self.graph.get_collection_ref(key))
                for key in func_graph.ALLOWLIST_COLLECTIONS}
      for key, items in self.collections.items():
        self.graph.get_collection_ref(key)[:] = items
      _global_step_read(self.graph)
      try:
        yield self.graph
      finally:
        for key, items in shared.items():
          self.graph.get_collection_ref(key)[:] = items

  def pruned(self, fetches):
    """pruning.Pruned of fetches (elements of this graph), fed this step's inputs if needed."""
    return pruning.Pruned(self.graph, fetches, feeds=self.inputs)


def finalize_summary_op(trace, training):
  """The spec's Scaffold gets the summary op its finalize() would give it (a hook may use it).

  The Estimator adds a `loss` scalar summary when training, unless the
  model_fn made one, then the MonitoredSession finalizes the spec's
  Scaffold, whose summary_op becomes the merge of every summary. Call with
  trace.as_default().
  """
  scaffold = getattr(trace.spec, "scaffold", None)
  if scaffold is None or scaffold.summary_op is not None:
    return
  summaries = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
  if training and not any(s.op.name == "loss" for s in summaries):
    with trace.graph.name_scope(None):
      tf.compat.v1.summary.scalar("loss", trace.spec.loss)
  scaffold._summary_op = tf.compat.v1.summary.merge_all()  # pylint: disable=protected-access


def _global_step_read(graph):
  """The global step's read tensor hooks share (`_get_or_create_global_step_read()`).

  TF 1 makes it with a cond on whether the variable is initialized, which
  needs the variable's initial value: the engine's global step was made
  outside any graph and has none. The read made here is what hooks get;
  the engine serves its value at each step without fetching it.
  """
  if graph.get_collection(training_util.GLOBAL_STEP_READ_KEY):
    return
  step = tf.compat.v1.train.get_global_step(graph)
  if step is not None:
    with graph.name_scope(None), graph.name_scope("global_step/"):
      graph.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, tf.identity(step) + 0)


def carried(leaves, source, store):
  """{key: tensor} in the graph being traced for each carried Leaf; stand-ins after replica 0.

  Args:
    leaves: {key: fetches.Leaf} to carry (tensors and variables).
    source: the StepTrace the keys were resolved in (the hooks' graph).
    store: the engine's VariableStore.
  """
  if replica_id() != 0:
    return {key: _stand_in(leaf) for key, leaf in leaves.items()}
  graph = tf.compat.v1.get_default_graph()
  op_map = object_identity.ObjectIdentityDictionary()
  found = {}
  for key, leaf in leaves.items():
    if leaf.kind == fetches_lib.VARIABLE:
      found[key] = tf.identity(store.variables[key])
    else:
      found[key] = tf.identity(_counterpart(source.graph.get_tensor_by_name(key), source, graph,
                                            op_map))
  return found


def _stand_in(leaf):
  shape = [d or 0 for d in leaf.shape] if leaf.shape is not None else []
  if leaf.dtype == tf.string:
    return tf.fill(shape, "")
  return tf.zeros(shape, leaf.dtype)


def _counterpart(tensor, source, graph, op_map):
  """tensor of source.graph in graph: by name, or copied if a hook made it after the trace."""
  if tensor in op_map:
    return op_map[tensor]
  if tensor.graph is graph:
    return tensor
  value = pruning.outer_value(tensor)
  if value is not None:  # a variable's handle the source graph captured
    return graph.capture(value)
  if not source.made_after(tensor.op):
    try:
      return graph.get_tensor_by_name(tensor.name)
    except KeyError:
      raise fetches_lib.FetchError(
          f"{tensor.name} is not in the step's graph as traced again for the hooks' fetches "
          "(the model_fn named its tensors differently in another trace)") from None
  for original in tensor.op.inputs:
    op_map[original] = _counterpart(original, source, graph, op_map)
  # Control inputs are left out: the copy runs inside the new step, after what it reads.
  lift_to_graph._copy_non_source(tensor.op, graph, op_map, source.graph)  # pylint: disable=protected-access
  return op_map[tensor]


def function_name(name, carry):
  """The engine's cache name of a step function carrying carry = (leaves, source trace)."""
  if not carry:
    return name
  leaves, source = carry
  return (name, source.number, *sorted(leaves))


def steps_array(leaf, steps):
  """A TensorArray for one carried tensor, a value per step of the loop."""
  shape = None if leaf.shape is None else tf.TensorShape(list(leaf.shape))
  return tf.TensorArray(leaf.dtype, size=steps, element_shape=shape)


def first_replica_steps(strategy, carried):
  """{key: the first replica's value with a leading step axis of 1} of carried."""
  return {key: tf.expand_dims(strategy.experimental_local_results(value)[0], 0)
          for key, value in carried.items()}
