"""Cross-replica sums in a traced step, as XLA all-reduces over the JAX mesh's replicas.

On a TPU, TPUEstimator traces the model_fn once for all cores inside a
`tpu_shard_context` of N shards; `CrossShardOptimizer` scales the loss by
1/N (its MEAN reduction) and sums the gradients with `CrossReplicaSum`, and
model code may call `tf.compat.v1.tpu.cross_replica_sum` itself (cross-replica
batch norm). The JAX engine traces each replica's step the same way:

- within `replicas(n)` the TPU shard context says n shards, so
  CrossShardOptimizer (and code that reads `number_of_shards`) does what it
  does on n TPU cores;
- CrossReplicaSum over all replicas becomes XLA's all-reduce across the
  partitions of the SPMD program JAX runs the step in (`XlaAllReduce`,
  CrossReplicaAndPartition), which TensorFlow's XLA bridge lowers for any
  platform; sums over subgroups of replicas are refused;
- any other TF 1 optimizer's gradients (the program's own subclasses too,
  whatever apply_gradients they define) are averaged over the replicas before
  it applies them, as the distribute engine's strategy does (a TPU would let
  each core apply its own);
- `Reductions.count` says how many sums the trace made: a step with several
  replicas that updated trainable variables without one has no gradient
  exchange (an optimizer the engine does not know) and is refused.
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.compiler.tf2xla.ops import gen_xla_ops
from tensorflow.python.ops import gen_tpu_ops
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer

_CrossShard = tpu_optimizer.CrossShardOptimizer
_Optimizer = tf.compat.v1.train.Optimizer
_ORIGINAL_SUM = gen_tpu_ops.cross_replica_sum


class CollectiveError(ValueError):
  """A cross-replica operation the JAX engine cannot run; the message says which and why."""


class Reductions(threading.local):
  """The trace's replica count and how many cross-replica sums it made."""

  def __init__(self):
    super().__init__()
    self.replicas = None
    self.count = 0
    self.applying = False


_current = Reductions()


def all_replicas_sum(x):
  """x summed over every replica of the JAX mesh (a no-op on one)."""
  x = tf.convert_to_tensor(x)
  _current.count += 1
  if _current.replicas == 1:
    return tf.identity(x)
  # One replica group, [[0]]: with a channel, XLA reduces over every partition of
  # that one replica, i.e. over every device of the SPMD program JAX runs.
  return gen_xla_ops.xla_all_reduce(x, tf.constant([[0]], tf.int32), reduce_op="Add",
                                    mode="CrossReplicaAndPartition")


def _cross_replica_sum(input, group_assignment, name=None):  # noqa: A002  (TF's own signature)
  del name
  groups = tf.get_static_value(group_assignment)
  if groups is None or len(groups) != 1 or sorted(groups[0]) != list(range(_current.replicas)):
    raise CollectiveError(
        f"cross_replica_sum over the replica groups {groups!r}: the JAX engine sums over all "
        f"{_current.replicas} replicas only; leave group_assignment out")
  return all_replicas_sum(input)


def _averaged(grads_and_vars):
  if _current.replicas == 1:
    return grads_and_vars  # one replica's gradient is the mean: the graph stays the program's
  scale = 1.0 / _current.replicas
  averaged = []
  for grad, var in grads_and_vars:
    if grad is not None:
      if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)  # an embedding's rows: summed densely
      grad = all_replicas_sum(grad) * tf.cast(scale, grad.dtype)
    averaged.append((grad, var))
  return averaged


def _applying(original):
  """An optimizer class's own apply_gradients, given the replicas' mean gradient.

  Only the outermost call averages (a subclass's apply_gradients that calls
  its base's, or CrossShardOptimizer's that calls the optimizer it wraps); a
  CrossShardOptimizer's gradients are summed by its own CrossReplicaSum.
  """

  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    if _current.applying or _current.replicas is None:
      return original(self, grads_and_vars, *args, **kwargs)
    _current.applying = True
    try:
      if not isinstance(self, _CrossShard):
        grads_and_vars = _averaged(list(grads_and_vars))
      return original(self, grads_and_vars, *args, **kwargs)
    finally:
      _current.applying = False

  apply_gradients.original = original
  return apply_gradients


def _optimizer_classes():
  """Every TF 1 optimizer class (the program's own too) that defines apply_gradients."""
  found, pending = [], [_Optimizer]
  while pending:
    cls = pending.pop()
    pending.extend(cls.__subclasses__())
    if "apply_gradients" in cls.__dict__ and cls not in found:
      found.append(cls)
  return found


def reductions_made():
  """How many cross-replica sums the trace in this thread has made since replicas() began."""
  return _current.count


_lock = threading.Lock()
_depth = [0]
_patched = []


def _patch():
  gen_tpu_ops.cross_replica_sum = _cross_replica_sum
  for cls in _optimizer_classes():
    original = cls.__dict__["apply_gradients"]
    cls.apply_gradients = _applying(original)
    _patched.append((cls, original))


def _unpatch():
  gen_tpu_ops.cross_replica_sum = _ORIGINAL_SUM
  while _patched:
    cls, original = _patched.pop()
    cls.apply_gradients = original


@contextlib.contextmanager
def replicas(num_replicas):
  """Within: a replica's step traced for num_replicas replicas (see the module's docstring).

  Yields:
    the Reductions of this trace.
  """
  _current.replicas, _current.count = num_replicas, 0
  with _lock:
    _depth[0] += 1
    if _depth[0] == 1:
      _patch()
  try:
    with _shard_context(num_replicas):
      yield _current
  finally:
    _current.replicas = None
    with _lock:
      _depth[0] -= 1
      if _depth[0] == 0:
        _unpatch()


@contextlib.contextmanager
def _shard_context(num_replicas):
  """TPUEstimator's tpu_shard_context, unless the program's code already holds one."""
  if tpu_function.get_tpu_context().number_of_shards is not None:
    yield
    return
  with tpu_function.tpu_shard_context(num_replicas):
    yield
