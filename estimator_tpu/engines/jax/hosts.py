"""The hosts of a JAX engine run (jax.distributed): who writes, and the stops all agree on.

The distribute engine's workers.Workers, with JAX's processes for a
MultiWorkerMirroredStrategy's workers: process 0 is the chief, which writes
the checkpoints, summaries and export; a sum over the hosts (the barrier of
a save, the agreement on a stop or a preemption signal) is an all-gather
among the processes (`jax.experimental.multihost_utils`). On one host
nothing here does anything.
"""

import jax
import numpy as np

from estimator_tpu.engines.distribute import workers as workers_lib


class Hosts(workers_lib.Workers):
  """The processes of this JAX run, as the distribute engine's Workers."""

  def __init__(self):  # pylint: disable=super-init-not-called
    self._strategy = None
    self.many = jax.process_count() > 1
    self.is_chief = jax.process_index() == 0
    self._all_sum = None
    self._scratch = None

  def sum(self, values):
    """values (a list of ints) summed over every host; as given on one."""
    values = np.asarray(values, np.int32)
    if not self.many:
      return values.astype(np.int64)
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    gathered = multihost_utils.process_allgather(values)
    return np.asarray(gathered).reshape(jax.process_count(), -1).sum(axis=0).astype(np.int64)
