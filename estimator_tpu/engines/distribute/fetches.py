"""What a hook asks to fetch, resolved in the step's graph as TF 1's session.run resolves it.

`SessionRunArgs(fetches)` (and `session.run(fetches)`) takes a nested
structure (lists, tuples, namedtuples, dicts) of graph elements: tensors,
operations, variables, or their names ("total_loss:0", "train_op"). Each
leaf becomes a `Leaf` the engine can serve:

- `step`: the global step (the variable, `get_global_step()`, the read a
  hook makes with `_get_or_create_global_step_read()`): its value at the
  step, known without fetching anything (the estimator's fetch reads it
  before the step's train_op adds 1, which hooks expect);
- `tensor`: a tensor of the step's graph, by name: the step carries it out;
- `variable`: one of the engine's variables: its value, read in the step;
- `op`: an operation: runs with the step, result None.

`rebuild` puts the values back into the structure the hook gave, as
session.run returns it (a tuple stays a tuple, a dict the same kind of dict).
"""

import dataclasses

import tensorflow as tf
from tensorflow.python.training import training_util

STEP, TENSOR, VARIABLE, OP = "step", "tensor", "variable", "op"


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One fetched element: its kind and the name the engine carries it by."""
  kind: str
  key: str = ""
  dtype: object = None
  shape: tuple = None


class FetchError(ValueError):
  """A fetch the engine cannot serve; the message names it and what to do."""


def resolve(fetches, graph, variables):
  """fetches as a structure of Leaf.

  Args:
    fetches: what a hook's SessionRunArgs (or session.run) names.
    graph: the step's graph (the replica's, where the model_fn was traced).
    variables: {name: variable} of the engine's variables.

  Raises:
    FetchError: a leaf that is no graph element of the step, or a kind the
      engine does not carry (a SparseTensor, a resource).
  """
  return tf.nest.map_structure(lambda x: _leaf(x, graph, variables), fetches)


def _leaf(fetch, graph, variables):
  step_variable = variables.get(tf.compat.v1.GraphKeys.GLOBAL_STEP)
  if isinstance(fetch, str):
    fetch = _by_name(fetch, graph, variables)
  if isinstance(fetch, tf.Variable):
    container = getattr(fetch, "_distributed_container", None)  # one replica's copy
    fetch = (container() if callable(container) else None) or fetch
    if fetch is step_variable:
      return Leaf(STEP)
    parent = getattr(fetch, "_parent_op", None)
    if parent is not None:  # what a train_op is under a strategy (TF 1's was an Operation)
      return Leaf(OP, parent.name)
    name = _variable_name(fetch, variables)
    return Leaf(VARIABLE, name, fetch.dtype.base_dtype, tuple(fetch.shape.as_list()))
  if isinstance(fetch, tf.Operation):
    _check_graph(fetch, graph)
    return Leaf(OP, fetch.name)
  if isinstance(fetch, tf.SparseTensor):
    raise FetchError(f"the SparseTensor {fetch.indices.name[:-len('/indices:0')] or fetch} "
                     "is fetched: fetch its values, indices and dense_shape tensors instead")
  if isinstance(fetch, tf.Tensor):
    _check_graph(fetch, graph)
    if any(fetch is t for t in graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)):
      return Leaf(STEP)
    if fetch.dtype in (tf.resource, tf.variant):
      raise FetchError(f"{fetch.name} is a {fetch.dtype.name} tensor, which carries no value "
                       "to fetch: fetch a tensor computed from it")
    shape = fetch.shape.as_list() if fetch.shape.rank is not None else None
    return Leaf(TENSOR, fetch.name, fetch.dtype, None if shape is None else tuple(shape))
  raise FetchError(f"Fetch argument {fetch!r} has invalid type {type(fetch)!r}, must be a "
                   "string or Tensor. (as TF 1's session.run says)")


def _by_name(name, graph, variables):
  """A graph element by name; the engine's variables (made outside the trace) by theirs."""
  try:
    return graph.as_graph_element(name)
  except (KeyError, ValueError) as error:
    variable = variables.get(name.split(":")[0])
    if variable is not None and name.split(":")[1:] in ([], ["0"]):
      return variable
    raise FetchError(f"Fetch argument {name!r} cannot be interpreted as a Tensor: {error}") \
        from error


def _variable_name(variable, variables):
  for name, known in variables.items():
    if known is variable:
      return name
  raise FetchError(f"the variable {variable.name} is not one of the model_fn's variables")


def _check_graph(element, graph):
  if element.graph is not graph:
    raise FetchError(f"{element.name} is not an element of the step's graph (it was made in "
                     f"{element.graph}); hooks fetch tensors of the model_fn, or their names")


def flat_keys(structure, kinds=(TENSOR, VARIABLE)):
  """{key: Leaf} of the leaves that are carried out of the step."""
  if structure is None:
    return {}
  return {leaf.key: leaf for leaf in tf.nest.flatten(structure) if leaf.kind in kinds}


def rebuild(structure, value_of):
  """The structure with each Leaf replaced by value_of(leaf) (None for an operation)."""
  return tf.nest.map_structure(lambda leaf: None if leaf.kind == OP else value_of(leaf),
                               structure)
