"""The replicas of a JAX engine run: JAX devices in one mesh, and how values are laid over them.

Every replica is one JAX device: by default all of them (every local device,
and with `jax.distributed` every host's), in a one-axis `Mesh` the engine's
step runs over with `shard_map`. A run's values take one of two layouts:

- per replica, `[replicas, ...]` split over the mesh's axis: the variables
  (each device holds its own copy, as a TPU core does: batch norm statistics
  differ per replica, trained weights stay equal because their gradients are
  summed), and each replica's batch;
- replicated, one value on every device (what is read back of a variable).

A host makes the part of a global value its own devices hold
(`jax.make_array_from_process_local_data`), so the same code runs on one
device, on every GPU of a machine and on every host of a TPU slice.
"""

import json
import os

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from estimator_tpu import stacks

AXIS = "replicas"
# --strategy on the JAX engine: the devices each takes.
STRATEGY_RULES = {
    "none": "every JAX device (every host's after jax.distributed)",
    "mirrored": "every JAX device, as none",
    "one_device": "the first local JAX device",
    "multi_worker": "every device of every host: jax.distributed over TF_CONFIG's cluster",
}


class DeviceError(ValueError):
  """The devices a run asks for are not there; the message says what to do."""


def for_run(strategy, use_tpu, environ=os.environ, deterministic=False):
  """The Devices of a --engine=jax run with --strategy and --use_tpu (STRATEGY_RULES).

  With deterministic (--deterministic), XLA's GPU compiler is asked for
  deterministic ops (before JAX starts its backends; CPU and TPU programs are
  deterministic as compiled).

  Raises:
    DeviceError: --use_tpu where JAX has no TPU, an unknown strategy, or a
      TF_CONFIG multi_worker cannot start from.
  """
  if strategy not in STRATEGY_RULES:
    raise DeviceError(f"--strategy={strategy} is not for --engine=jax: use one of "
                      f"{', '.join(STRATEGY_RULES)}")
  if deterministic:
    _deterministic_gpu_ops(environ)
  if strategy == "multi_worker":
    initialize_distributed(environ)
  platform = jax.default_backend()
  if use_tpu and platform != "tpu":
    raise DeviceError(f"--use_tpu with --engine=jax needs JAX's TPU backend; JAX runs on "
                      f"{platform} here (install jax[tpu] on a TPU VM, or leave --use_tpu out)")
  if platform == "cpu" and not stacks.HOST_XLA:
    raise DeviceError(
        f"--engine=jax on the CPU needs TensorFlow's XLA bridge for the host, which this "
        f"stack's TensorFlow ({stacks.NAME}: the TPU build) lacks; on a TPU VM it lowers for "
        "the TPU; on a CPU use the current stack")
  if strategy == "one_device":
    return Devices(jax.local_devices()[:1])
  return Devices(jax.devices())


def _deterministic_gpu_ops(environ):
  flag = "--xla_gpu_deterministic_ops=true"
  flags = environ.get("XLA_FLAGS", "")
  if flag not in flags.split():
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()


def _distributed_initialized():
  is_initialized = getattr(jax.distributed, "is_initialized", None)
  if is_initialized is not None:
    return is_initialized()
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  return distributed.global_state.client is not None


def initialize_distributed(environ=os.environ):
  """jax.distributed over TF_CONFIG's cluster: the chief (else worker 0) coordinates.

  Each task of TF_CONFIG is one JAX process, in the order chief, then
  workers; the coordinator listens at the first task's address. Without
  TF_CONFIG, JAX finds the cluster itself (Cloud TPU slices, SLURM, ...).
  """
  if _distributed_initialized():
    return
  raw = environ.get("TF_CONFIG")
  if not raw:
    jax.distributed.initialize()
    return
  try:
    config = json.loads(raw)
    cluster, task = config["cluster"], config["task"]
    tasks = [(kind, i) for kind in ("chief", "worker") for i in range(len(cluster.get(kind, [])))]
    addresses = [cluster[kind][i] for kind, i in tasks]
    process_id = tasks.index((task["type"], int(task["index"])))
  except (ValueError, KeyError, TypeError) as e:
    raise DeviceError(f"TF_CONFIG={raw!r} names no chief/worker cluster and task for "
                      f"--strategy=multi_worker ({e})") from None
  # CPU devices of several processes sum over gloo (accelerators use their own fabric).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=addresses[0], num_processes=len(addresses),
                             process_id=process_id)


class Devices:
  """The mesh of a run's replicas.

  Args:
    devices: the JAX devices, one per replica, in replica order.
  """

  def __init__(self, devices):
    self.devices = list(devices)
    self.mesh = Mesh(np.array(self.devices), (AXIS,))
    self.local = [d for d in self.devices if d.process_index == jax.process_index()]
    self.platform = self.devices[0].platform

  @property
  def num_replicas(self):
    return len(self.devices)

  @property
  def num_local(self):
    return len(self.local)

  @property
  def num_hosts(self):
    return len({d.process_index for d in self.devices})

  def describe(self):
    """'2 cpu devices', '8 tpu devices over 2 hosts': what the engine's first line says."""
    count = self.num_replicas
    text = f"{count} {self.platform} device{'s' if count != 1 else ''}"
    hosts = self.num_hosts
    return text + (f" over {hosts} hosts" if hosts > 1 else "")

  def sharding(self):
    """Values laid per replica, `[replicas, ...]`."""
    return NamedSharding(self.mesh, PartitionSpec(AXIS))

  def replicated_copies(self, value):
    """A host value as every replica's copy of it: `[replicas, *value.shape]`."""
    value = np.asarray(value)
    local = np.broadcast_to(value, (self.num_local, *value.shape))
    return jax.make_array_from_process_local_data(self.sharding(), local)

  def from_local(self, local):
    """A global value from this host's part: its replicas', `[local replicas, ...]`."""
    return jax.make_array_from_process_local_data(self.sharding(), local)



def local_values(array):
  """This host's replicas' values of a per-replica array: `[local replicas, ...]` in NumPy."""
  shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start or 0)
  return np.concatenate([np.asarray(s.data) for s in shards], axis=0)
