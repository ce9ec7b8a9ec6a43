"""The program's variables as JAX arrays: every replica's copy, and the way back to TensorFlow's.

The engine's variables are TensorFlow's (the distribute engine's
VariableStore: the estimator's names, checkpoints, hooks, the graph twin).
While steps run, their values live on the JAX devices, one copy per
replica (`[replicas, ...]`); `State` moves them:

- `pull()`: TensorFlow's values to every replica, after anything on the host
  set them (a checkpoint restored, a fresh start's initial values, local
  variables reset for a new evaluation);
- `push(names)`: the replicas' values back into TensorFlow's variables, before
  a checkpoint is saved, metric values are read, or a run ends. One value per
  variable, as the distribute engine's strategy reads one: a variable synced
  on read reads as its aggregation says (batch norm statistics, the mean over
  replicas; a metric's totals, their sum), any other as the first replica's
  (trained weights and slots are equal on every replica).
"""

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf

from estimator_tpu.engines.jax import devices as devices_lib


class State:
  """The values of a VariableStore's variables on the mesh of `devices`.

  Args:
    store: the engine's VariableStore.
    devices: devices.Devices.
  """

  def __init__(self, store, devices):
    self._store = store
    self._devices = devices
    self.values = {}  # name -> jax.Array [replicas, ...]
    self._initial = {}  # name of a local variable -> its value when last pulled
    self._read = {}  # (shape, dtype, how) -> a jitted reduction over the replicas

  def pull(self, names=None):
    """TensorFlow's current values of names (default: every variable) onto every replica."""
    for name in names if names is not None else list(self._store.variables):
      value = self._store.variables[name].read_value().numpy()
      self.values[name] = self._devices.replicated_copies(value)
      if name in self._store.local_names:
        self._initial[name] = value

  def ensure(self, names):
    """Pulls those of names that have no values on the devices yet (made by a new trace)."""
    missing = [name for name in names if name not in self.values]
    if missing:
      self.pull(missing)

  def push(self, names=None):
    """The replicas' values of names (default: every variable) into TensorFlow's variables."""
    for name in names if names is not None else list(self.values):
      if name in self.values:
        self._store.variables[name].assign(self.read(name))

  def read(self, name):
    """One NumPy value of a variable, read from its replicas' copies as TensorFlow reads it."""
    array = self.values[name]
    how = self._how(name)
    if how == "first" or self._devices.num_replicas == 1:
      return devices_lib.local_values(array)[0]
    reduce = self._reduction(array, how)
    if how == "sum_changes":
      return np.asarray(reduce(array, self._initial[name]))
    return np.asarray(reduce(array))

  def _how(self, name):
    variable = self._store.variables[name]
    if getattr(variable, "synchronization", None) != tf.VariableSynchronization.ON_READ:
      return "first"
    aggregation = getattr(variable, "aggregation", None)
    if aggregation == tf.VariableAggregation.SUM:
      # Each replica's totals started from the value pulled: the sum of what they added.
      return "sum_changes" if name in self._initial else "sum"
    if aggregation == tf.VariableAggregation.MEAN:
      return "mean"
    return "first"

  def _reduction(self, array, how):
    key = (array.shape, str(array.dtype), how)
    if key not in self._read:
      replicated = jax.sharding.NamedSharding(self._devices.mesh, jax.sharding.PartitionSpec())
      if how == "mean":
        fn = lambda a: jnp.mean(a, axis=0).astype(a.dtype)  # noqa: E731
      elif how == "sum":
        fn = lambda a: jnp.sum(a, axis=0).astype(a.dtype)  # noqa: E731
      else:
        fn = lambda a, initial: (initial + jnp.sum(a - initial, axis=0)).astype(a.dtype)  # noqa: E731
      self._read[key] = jax.jit(fn, out_shardings=replicated)
    return self._read[key]

  def step_value(self, name):
    """A scalar integer variable's value (the global step), from the first replica."""
    return int(devices_lib.local_values(self.values[name])[0])

  def clear(self):
    self.values.clear()
    self._initial.clear()
