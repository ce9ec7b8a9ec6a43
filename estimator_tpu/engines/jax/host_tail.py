"""String results of a step (class names, summaries for hooks) computed on the host.

JAX devices hold no strings, and TensorFlow's XLA bridge lowers no string op;
TPUEstimator's programs make strings off TPU all the same: predictions (a
`tf.gather` of class names by the predicted id, a lookup table) and what
their hooks fetch (a SummarySaverHook's merged summaries). The JAX
engine runs such a prediction in two parts: the device computes the numeric
tensors the string ops read (the `frontier`), and the host runs the string
ops on them, pruned from the traced step (pruning.py), for each replica's
batch.
"""

import numpy as np
import tensorflow as tf

from estimator_tpu.engines.distribute import pruning

# Inputs a string op reads that the host side keeps: strings, tables and other handles.
_HOST_DTYPES = (tf.string, tf.resource, tf.variant)


class HostTail:
  """The string tensors among a step's results, and the numeric tensors they are computed from.

  Args:
    tensors: {name: tensor} of the traced step (its predictions).

  Attributes:
    device: {name: tensor} the device computes (the numeric ones).
    frontier: the numeric tensors the string ones read, which the device
      also returns.
  """

  def __init__(self, tensors):
    self.device = {k: t for k, t in tensors.items() if t.dtype not in _HOST_DTYPES}
    self._host = {k: t for k, t in tensors.items() if t.dtype in _HOST_DTYPES}
    self.frontier = _frontier(list(self._host.values()))
    self._pruned = None
    self._graph = None
    if self._host:
      self._graph = next(iter(self._host.values())).graph

  def __bool__(self):
    return bool(self._host)

  def compute(self, frontier_values):
    """{name: NumPy value} of the string results from one replica's frontier values."""
    if not self._host:
      return {}
    if self._pruned is None:
      names = sorted(self._host)
      self._pruned = (names, pruning.Pruned(self._graph, [self._host[n] for n in names],
                                            feeds=self.frontier))
    names, pruned = self._pruned
    values = (pruned(*[tf.constant(v) for v in frontier_values]) if pruned.uses_feeds
              else pruned())
    return dict(zip(names, values))

  def concatenated(self, frontier_values, replicas):
    """{name: values} of the string results of the first `replicas` replicas, concatenated.

    Args:
      frontier_values: a `[replicas, ...]` array for each frontier tensor.
      replicas: how many replicas' values to compute.
    """
    per_replica = self._each(frontier_values, [(r,) for r in range(replicas)])
    return {name: np.concatenate([_objects(values[name]).reshape(-1, *np.shape(values[name])[1:])
                                  for values in per_replica])
            for name in self._host}

  def stacked(self, frontier_values, indices):
    """{name: values stacked on a new first axis} of the string results at each index.

    Args:
      frontier_values: an array for each frontier tensor.
      indices: the index of each value into those arrays, e.g. (step, 0) for
        the first replica of each step of a loop, (0,) for one step's.
    """
    per_index = self._each(frontier_values, indices)
    return {name: np.stack([_objects(values[name]) for values in per_index])
            for name in self._host}

  def _each(self, frontier_values, indices):
    return [self.compute([v[index] for v in frontier_values]) for index in indices]


def _objects(value):
  """A string value as TensorFlow gives it to NumPy: bytes objects (no NUL-stripped 'S' arrays)."""
  array = np.empty(np.shape(value), dtype=object)
  array[...] = value
  return array


def _frontier(tensors):
  """The numeric tensors the string ops behind tensors read (walked back through host ops)."""
  frontier, seen, stack = [], set(), [t.op for t in tensors]
  while stack:
    op = stack.pop()
    if op in seen:
      continue
    seen.add(op)
    for tensor in op.inputs:
      if tensor.dtype in _HOST_DTYPES:
        stack.append(tensor.op)
      elif not any(tensor is f for f in frontier):
        frontier.append(tensor)
  return frontier
