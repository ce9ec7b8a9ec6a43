"""Random ops in a JAX step: stateless draws keyed by the op, the global step and the replica.

TensorFlow's XLA bridge lowers a stateful random op (dropout's
RandomUniform) to XLA's own generator, which ignores the op's seeds: each
run, and each resume, would draw anew, and `--deterministic` would not hold.
While a replica step is traced for the JAX engine, the stateful random ops
TF 1 and TF 2 code builds on (uniform, normal, truncated normal, uniform
integers) are made as their stateless counterparts, keyed by:

- the op's own seeds (the RunConfig's tf_random_seed and the op's seed, as
  TensorFlow derives them) and its place among the step's random ops, so
  two dropouts of one step draw differently, run after run;
- the global step at the start of the step, so every step draws anew, and a
  run resumed from a checkpoint draws what the uninterrupted run drew;
- the replica, so each device's batch gets its own draws.
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.ops import gen_random_ops

_STATEFUL = ("random_uniform", "random_standard_normal", "truncated_normal",
             "random_uniform_int")
_ORIGINALS = {name: getattr(gen_random_ops, name) for name in _STATEFUL}


class _Keys(threading.local):

  def __init__(self):
    super().__init__()
    self.step = None  # () -> the global step tensor of the trace
    self.replica = None  # the replica id tensor of the trace
    self.graph = None  # the graph of the trace
    self.count = 0


_keys = _Keys()


def _in_the_step():
  """Whether an op made now is the traced step's (not an initial value made eagerly, aside)."""
  return not tf.executing_eagerly() and tf.compat.v1.get_default_graph() is _keys.graph


def _key(seed, seed2):
  """The stateless seed of the next random op of the trace: [op, step and replica], int64."""
  _keys.count += 1
  op = (int(seed or 0) * 1_000_003 + int(seed2 or 0)) * 1_009 + _keys.count
  step = tf.cast(_keys.step(), tf.int64)
  replica = tf.cast(_keys.replica, tf.int64)
  return tf.stack([tf.constant(op % (2 ** 62), tf.int64), step * 65_536 + replica])


def _uniform(shape, dtype, seed=0, seed2=0, name=None):
  if not _in_the_step():  # an initial value, made outside the step
    return _ORIGINALS["random_uniform"](shape, dtype, seed=seed, seed2=seed2, name=name)
  return tf.random.stateless_uniform(shape, _key(seed, seed2), dtype=dtype, name=name)


def _normal(shape, dtype, seed=0, seed2=0, name=None):
  if not _in_the_step():  # an initial value, made outside the step
    return _ORIGINALS["random_standard_normal"](shape, dtype, seed=seed, seed2=seed2, name=name)
  return tf.random.stateless_normal(shape, _key(seed, seed2), dtype=dtype, name=name)


def _truncated(shape, dtype, seed=0, seed2=0, name=None):
  if not _in_the_step():  # an initial value, made outside the step
    return _ORIGINALS["truncated_normal"](shape, dtype, seed=seed, seed2=seed2, name=name)
  return tf.random.stateless_truncated_normal(shape, _key(seed, seed2), dtype=dtype, name=name)


def _uniform_int(shape, minval, maxval, seed=0, seed2=0, name=None):
  if not _in_the_step():
    return _ORIGINALS["random_uniform_int"](shape, minval, maxval, seed=seed, seed2=seed2,
                                            name=name)
  return tf.random.stateless_uniform(shape, _key(seed, seed2), minval=minval, maxval=maxval,
                                     dtype=minval.dtype if hasattr(minval, "dtype") else tf.int64,
                                     name=name)


_KEYED = {"random_uniform": _uniform, "random_standard_normal": _normal,
          "truncated_normal": _truncated, "random_uniform_int": _uniform_int}
_lock = threading.Lock()
_depth = [0]


@contextlib.contextmanager
def keyed(replica_id):
  """Within a replica step's trace: stateful random ops drawn as described above.

  Args:
    replica_id: the replica's id, a scalar integer tensor of the trace.
  """
  _keys.step = lambda: tf.compat.v1.train.get_or_create_global_step().read_value()
  _keys.replica, _keys.graph, _keys.count = replica_id, replica_id.graph, 0
  with _lock:
    _depth[0] += 1
    if _depth[0] == 1:
      for name, keyed_op in _KEYED.items():
        setattr(gen_random_ops, name, keyed_op)
  try:
    yield
  finally:
    _keys.step = _keys.replica = _keys.graph = None
    with _lock:
      _depth[0] -= 1
      if _depth[0] == 0:
        for name, original in _ORIGINALS.items():
          setattr(gen_random_ops, name, original)
