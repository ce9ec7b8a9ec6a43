"""String results of a step (class names looked up from class ids) computed on the host.

JAX devices hold no strings, and TensorFlow's XLA bridge lowers no string op;
TPUEstimator's programs add string predictions off TPU all the same (a
`tf.gather` of class names by the predicted id, a lookup table). The JAX
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

  def run(self, frontier_values, replicas):
    """{name: host values} of the string results, replica by replica, concatenated.

    Args:
      frontier_values: a `[replicas, ...]` array for each frontier tensor.
      replicas: how many replicas' values to compute.
    """
    if not self._host:
      return {}
    if self._pruned is None:
      names = sorted(self._host)
      self._pruned = (names, pruning.Pruned(self._graph, [self._host[n] for n in names],
                                            feeds=self.frontier))
    names, pruned = self._pruned
    per_replica = [pruned(*[tf.constant(v[r]) for v in frontier_values]) if pruned.uses_feeds
                   else pruned() for r in range(replicas)]
    return {name: np.concatenate([np.atleast_1d(values[i]) for values in per_replica])
            for i, name in enumerate(names)}


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
