"""Cross-replica sums in a traced step, as XLA all-reduces over the JAX mesh's replicas.

TPUEstimator on a TPU traces the model_fn once for all cores inside a
`tpu_shard_context` of N shards: `CrossShardOptimizer` scales the loss by 1/N
(its MEAN reduction) and sums the gradients with `CrossReplicaSum`, and model
code may call `tf.compat.v1.tpu.cross_replica_sum` itself (cross-replica
batch norm). Off TPU (use_tpu=False) there is no shard context: programs
test for it (TPU-only code paths, the compat layer's rules), and
CrossShardOptimizer is a plain optimizer. The JAX engine traces each
replica's step so that either way the replicas' gradients are combined once:

- with use_tpu (JAX's TPUs), inside TPUEstimator's shard context of N
  shards: CrossShardOptimizer runs as written, its CrossReplicaSum an XLA
  all-reduce across the partitions of the SPMD program JAX runs the step in
  (`XlaAllReduce`, CrossReplicaAndPartition), which TensorFlow's XLA bridge
  lowers for any platform; sums over subgroups of replicas are refused;
- off TPU, no shard context: CrossShardOptimizer hands its gradients to the
  optimizer it wraps (the SUM reduction scales the loss by N), as the
  distribute engine's rules do;
- any other TF 1 optimizer's gradients (the program's own subclasses too,
  whatever apply_gradients they define) are averaged over the replicas
  before it applies them, as a tf.distribute strategy does (a TPU would let
  each core apply its own);
- a cross_replica_sum of the model's own over its default group sums over
  every replica;
- `reductions_made()` says how many sums the trace made: a step with several
  replicas that updated trainable variables without one has no gradient
  exchange (an optimizer the engine does not know) and is refused.
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.compiler.tf2xla.ops import gen_xla_ops
from tensorflow.python.ops import gen_tpu_ops
from tensorflow.python.ops.losses import losses_impl
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_optimizer

_CrossShard = tpu_optimizer.CrossShardOptimizer
_Optimizer = tf.compat.v1.train.Optimizer
_ORIGINAL_SUM = gen_tpu_ops.cross_replica_sum
_CROSS_SHARD = {name: _CrossShard.__dict__[name]
                for name in ("compute_gradients", "apply_gradients")}


class CollectiveError(ValueError):
  """A cross-replica operation the JAX engine cannot run; the message says which and why."""


class _Trace(threading.local):
  """The trace's replica count, whether it is a TPU's, and how many sums it made."""

  def __init__(self):
    super().__init__()
    self.replicas = None
    self.on_tpu = False
    self.count = 0
    self.applying = False


_current = _Trace()


def all_replicas_sum(x):
  """x summed over every replica of the JAX mesh (an identity on one)."""
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
  every = list(range(_current.replicas))
  # Off TPU, TensorFlow's default group is [[0]] (it assumes one shard): every replica here.
  default = [[0]] if not _current.on_tpu else [every]
  if groups is None or [sorted(g) for g in groups] not in ([every], default):
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
  its base's); on a TPU a CrossShardOptimizer's gradients are summed by its
  own CrossReplicaSum, off TPU by the optimizer it wraps.
  """

  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    if _current.applying or _current.replicas is None:
      return original(self, grads_and_vars, *args, **kwargs)
    if isinstance(self, _CrossShard) and _current.on_tpu:
      _current.applying = True  # its CrossReplicaSum sums; the optimizer it wraps must not
    try:
      if not _current.applying:
        grads_and_vars = _averaged(list(grads_and_vars))
        _current.applying = True
      return original(self, grads_and_vars, *args, **kwargs)
    finally:
      _current.applying = False

  return apply_gradients


def _cross_shard_compute_gradients(self, loss, var_list=None, **kwargs):
  """Off TPU: the wrapped optimizer's gradients (of N times the loss for a SUM over shards)."""
  if self._reduction == losses_impl.Reduction.SUM:  # pylint: disable=protected-access
    loss = loss * float(_current.replicas)
  return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)  # pylint: disable=protected-access


def _cross_shard_apply_gradients(self, grads_and_vars, global_step=None, name=None):
  """Off TPU: the wrapped optimizer applies them (averaged over the replicas)."""
  return self._opt.apply_gradients(grads_and_vars, global_step, name)  # pylint: disable=protected-access


def _optimizer_classes():
  """Every TF 1 optimizer class (the program's own too) that defines apply_gradients."""
  found, pending = [], [_Optimizer]
  while pending:
    cls = pending.pop()
    pending.extend(cls.__subclasses__())
    if "apply_gradients" in cls.__dict__ and cls not in found and cls is not _CrossShard:
      found.append(cls)
  return found


def reductions_made():
  """How many cross-replica sums the trace in this thread has made since replicas() began."""
  return _current.count


_lock = threading.Lock()
_patched = []


def _patch(on_tpu):
  gen_tpu_ops.cross_replica_sum = _cross_replica_sum
  for cls in _optimizer_classes():
    original = cls.__dict__["apply_gradients"]
    cls.apply_gradients = _applying(original)
    _patched.append((cls, "apply_gradients", original))
  if on_tpu:
    _patched.append((_CrossShard, "apply_gradients", _CROSS_SHARD["apply_gradients"]))
    _CrossShard.apply_gradients = _applying(_CROSS_SHARD["apply_gradients"])
  else:
    for name, method in (("compute_gradients", _cross_shard_compute_gradients),
                         ("apply_gradients", _cross_shard_apply_gradients)):
      _patched.append((_CrossShard, name, _CROSS_SHARD[name]))
      setattr(_CrossShard, name, method)


def _unpatch():
  gen_tpu_ops.cross_replica_sum = _ORIGINAL_SUM
  while _patched:
    cls, name, original = _patched.pop()
    setattr(cls, name, original)


@contextlib.contextmanager
def replicas(num_replicas, on_tpu=False):
  """Within: a replica's step traced for num_replicas replicas (see the module's docstring).

  Args:
    num_replicas: the replicas the step runs on.
    on_tpu: whether they are a TPU's cores (the program's use_tpu): the trace
      is then in TPUEstimator's shard context.
  """
  with _lock:
    if _patched:
      raise RuntimeError("a JAX engine step is being traced already (one trace at a time)")
    _current.replicas, _current.on_tpu, _current.count = num_replicas, on_tpu, 0
    _patch(on_tpu)
  try:
    with _shard_context(num_replicas) if on_tpu else contextlib.nullcontext():
      yield _current
  finally:
    _current.replicas, _current.on_tpu = None, False
    with _lock:
      _unpatch()


@contextlib.contextmanager
def _shard_context(num_replicas):
  """TPUEstimator's tpu_shard_context, unless the program's code already holds one."""
  if tpu_function.get_tpu_context().number_of_shards is not None:
    yield
    return
  with tpu_function.tpu_shard_context(num_replicas):
    yield
