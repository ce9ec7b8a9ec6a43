"""A lowered replica step run by JAX on every replica of the mesh: loops of training steps, or one.

The replica step (lowering.LoweredStep) takes the variables it captured and
a replica's batch, and returns its results followed by the new value of each
variable it updates (`finals`). `MeshStep` runs it under `jax.jit` and
`shard_map` over the mesh: each device holds its replica's copy of the
variables (`[replicas, ...]`) and gets its replica's batch.

- training (`loop=True`) runs `steps` steps per call, the batches stacked
  `[steps, replicas, ...]`, the variables donated. The steps are dispatched
  one after the other without waiting (JAX runs them asynchronously) and
  their results fetched once, after the last: one host round trip per
  `iterations_per_loop` steps, as TPUEstimator's training loop on a TPU. (A
  `lax.scan` over the steps would make it one program, but XLA's CPU
  compiler runs the convolutions of a loop's body ~60x slower than the same
  ones outside a loop: benchmarks/README.md);
- evaluation and prediction run one step per call; a replica without a batch
  of its own (the input's last group of batches is short of one per device)
  runs a copy of another's and its results are dropped (`real`), its
  variables (metric totals) left as they were.
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from estimator_tpu.engines.jax import devices as devices_lib


class MeshStep:
  """A LoweredStep over the mesh of `devices`.

  Args:
    lowered: the lowering.LoweredStep.
    names: {variable: its name in the State} of lowered.variables.
    final_names: the names of the variables whose new values follow the
      step's results, in their order.
    devices: devices.Devices.
    loop: a training loop (steps per call, donated variables) or one step.
  """

  def __init__(self, lowered, names, final_names, devices, loop):
    self._lowered = lowered
    self._captured = [names[v.ref()] for v in lowered.variables]
    self._finals = list(final_names)
    self.state_names = list(dict.fromkeys(self._captured + self._finals))
    self._num_results = len(lowered.out_avals) - len(self._finals)
    self._devices = devices
    self._loop = loop
    spec = jax.sharding.PartitionSpec(devices_lib.AXIS)
    mapped = _shard_map(self._one_step, devices.mesh, (spec, spec, spec), (spec, spec))
    self._run = jax.jit(mapped, donate_argnums=(0,) if loop else ())

  def __call__(self, state, batch, real=None):
    """Runs the step(s); returns the results as host NumPy values, the variables updated in state.

    Args:
      state: the State holding every name in state_names.
      batch: the flat per-replica batch, this host's part: arrays
        `[steps, local replicas, ...]` (a loop) or `[local replicas, ...]`.
      real: [local replicas] bools, False for a replica whose batch is a copy
        (one step only); None: all are real.

    Returns:
      The step's flat results, each `[steps, replicas, ...]` or
      `[replicas, ...]`, over every replica of every host.
    """
    devices = self._devices
    real = devices.from_local(np.ones([devices.num_local], bool) if real is None else real)
    values = tuple(state.values[name] for name in self.state_names)
    steps = len(batch[0]) if self._loop else 1
    per_step = []
    for i in range(steps):
      step_batch = [devices.from_local(np.asarray(x[i] if self._loop else x)) for x in batch]
      values, results = self._run(values, step_batch, real)
      per_step.append(results)
    for name, value in zip(self.state_names, values):
      state.values[name] = value
    if not self._loop:
      return [self._to_host(r) for r in per_step[0]]
    return [np.stack([self._to_host(results[i]) for results in per_step])
            for i in range(len(per_step[0]))]

  def _to_host(self, array):
    if self._devices.num_hosts > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return devices_lib.local_values(array)

  def step(self, values, batch, replica_id=0):
    """One replica's step: (its variables' values after the step, its results)."""
    outputs = self._lowered.bind([values[name] for name in self._captured],
                                 jnp.asarray(replica_id, jnp.int32), *batch)
    values = dict(values, **dict(zip(self._finals, outputs[self._num_results:])))
    return values, list(outputs[:self._num_results])

  def _one_step(self, values, batch, real):
    before = dict(zip(self.state_names, (v[0] for v in values)))
    after, results = self.step(before, [x[0] for x in batch], lax.axis_index(devices_lib.AXIS))
    if self._loop:  # training: every replica has its batch
      values = after
    else:
      kept = functools.partial(jnp.where, real[0])
      values = {name: kept(after[name], before[name]) for name in self.state_names}
    return (tuple(values[name][None] for name in self.state_names),
            [r[None] for r in results])


def _shard_map(body, mesh, in_specs, out_specs):
  """shard_map without JAX's replication types: TensorFlow's step is opaque to them."""
  try:
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)
  except (AttributeError, TypeError):  # jax < 0.6: jax.experimental.shard_map, check_rep
    from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
    return shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=False)


def stack_steps(groups):
  """groups[step][local replica] = a flat batch, as one flat `[steps, local replicas, ...]`."""
  return [np.stack([np.stack([replica[i] for replica in group]) for group in groups])
          for i in range(len(groups[0][0]))]


def stack_replicas(group, num_local):
  """Up to num_local replicas' flat batches as the flat `[local replicas, ...]` batch, and `real`.

  Replicas past the group's batches get copies of its last one, marked not real.
  """
  real = np.arange(num_local) < len(group)
  padded = list(group) + [group[-1]] * (num_local - len(group))
  return [np.stack([replica[i] for replica in padded]) for i in range(len(group[0]))], real
