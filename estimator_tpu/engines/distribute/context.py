"""params['context'] on the distribute engine: TPUEstimator's TPUContext over the strategy's hosts.

TPUEstimator hands an input_fn a `TPUContext` (tpu_context.py) that answers
from its internal TPU context: how many replicas and hosts, which host this
call feeds, the host device of each replica. The engine hands the same class
(a subclass, so `isinstance(ctx, TPUContext)` holds and TensorFlow's own
methods compute `current_input_fn_deployment()`), answering for the strategy:

    strategy                     hosts (input pipelines)       replicas per host
    OneDeviceStrategy            1 (this machine)              1
    MirroredStrategy, N devices  1 (this machine)              N
    MultiWorkerMirroredStrategy  one per worker (TF_CONFIG)    devices per worker
    TPUStrategy                  one per TPU host              cores per host

The engine calls the input_fn once per host (PER_HOST_V2, what
tensorflow/tpu's reference models ask for), so `current_input_fn_deployment()`
is `(host device, host index, number of hosts, replicas per host)` whatever
the RunConfig's `per_host_input_for_training` says. Devices are the
strategy's own names (`/job:localhost/replica:0/task:0/device:CPU:0`); a
TPUEstimator on a TPU whose master is local names them `/replica:0/task:0/...`.
A model_fn gets a context only on a TPU (TPUStrategy), as TPUEstimator gives
one only when it runs the model_fn on a TPU; `device_assignment` is None there
as on TPUEstimator without model parallelism, which the engine does not run.
"""

import collections

import tensorflow as tf
from tensorflow.python.distribute import multi_worker_util
from tensorflow_estimator.python.estimator.tpu import tpu_context

# The jobs whose tasks each run one input pipeline of a MultiWorkerMirroredStrategy.
_WORKER_JOBS = ("chief", "worker")


def strategy_hosts(strategy, num_hosts=None):
  """The host CPU device of each of the strategy's num_hosts input pipelines, in pipeline order.

  Args:
    strategy: a tf.distribute strategy.
    num_hosts: its number of input pipelines (InputContext.num_input_pipelines);
      None: the hosts of its replicas' devices.

  Returns:
    A tuple of num_hosts device strings; an entry is None where this process
    cannot know the device (never for the strategies above).
  """
  by_task = collections.OrderedDict()
  for device in strategy.extended.worker_devices:
    spec = tf.DeviceSpec.from_string(device)
    by_task.setdefault((spec.job, spec.replica, spec.task),
                       spec.replace(device_type="CPU", device_index=0).to_string())
  hosts = tuple(by_task.values())
  if num_hosts is None or len(hosts) == num_hosts:
    return hosts
  return _cluster_hosts(getattr(strategy, "cluster_resolver", None), num_hosts)


def _cluster_hosts(resolver, num_hosts):
  """Hosts of a multi-worker strategy, by each task's id in the cluster (its pipeline id)."""
  hosts = [None] * num_hosts
  if resolver is None:
    return tuple(hosts)
  cluster_spec = multi_worker_util.normalize_cluster_spec(resolver.cluster_spec())
  for job in _WORKER_JOBS:
    for task in range(len(cluster_spec.as_dict().get(job, ()))):
      index = multi_worker_util.id_in_cluster(cluster_spec, job, task)
      if index < num_hosts:
        hosts[index] = f"/job:{job}/replica:0/task:{task}/device:CPU:0"
  return tuple(hosts)


class StrategySystem:
  """What TPUContext reads of TPUEstimator's internal context, answered for a strategy.

  Args:
    num_replicas: the strategy's replicas in sync.
    hosts: the host device of each input pipeline (strategy_hosts()).
    mode: the ModeKeys value of the call.
  """

  model_parallelism_enabled = False
  device_assignment = None

  def __init__(self, num_replicas, hosts, mode=None):
    self.num_replicas = num_replicas
    self.hosts = tuple(hosts)
    self.mode = mode

  @property
  def num_hosts(self):
    return len(self.hosts)

  @property
  def num_of_replicas_per_host(self):
    return self.num_replicas // self.num_hosts

  # The engine's input deployment is PER_HOST_V2's: one input_fn call per host.
  def is_input_sharded_per_core(self):
    return False

  def is_input_broadcast_with_iterators(self):
    return False

  def is_replica_across_hosts(self):
    return False

  def host_device(self, host_id):
    if not 0 <= host_id < self.num_hosts:
      raise ValueError(f"host {host_id} is not one of the strategy's {self.num_hosts} hosts")
    device = self.hosts[host_id]
    if device is None:
      raise ValueError(f"this process does not know the device of host {host_id} of "
                       f"{self.num_hosts} (the strategy names its own host only)")
    return device

  def device_for_replica(self, replica_id):
    """(host CPU device, ordinal on that host) of a replica, as TPUEstimator's."""
    if not 0 <= replica_id < self.num_replicas:
      raise ValueError(f"replica {replica_id} is not one of the strategy's "
                       f"{self.num_replicas} replicas")
    per_host = self.num_of_replicas_per_host
    return self.host_device(replica_id // per_host), replica_id % per_host

  def tpu_host_placement_function(self, host_id=None, replica_id=None):
    """The host device of host_id or of replica_id's host, as TPUEstimator's placement function."""
    if (host_id is None) == (replica_id is None):
      raise RuntimeError("replica_id and host_id can have only one non-None value.")
    if replica_id is not None:
      return self.device_for_replica(replica_id)[0]
    return self.host_device(host_id)


class TPUContext(tpu_context.TPUContext):
  """TPUEstimator's TPUContext over a StrategySystem; also says the `mode` it serves."""

  def __init__(self, system, host_id=None, call_from_input_fn=True):
    device = system.hosts[host_id] if call_from_input_fn else None
    super().__init__(internal_ctx=system, input_device=device, invocation_index=host_id,
                     call_from_input_fn=call_from_input_fn, host_id=host_id)

  @property
  def mode(self):
    """The ModeKeys value of the input_fn or model_fn call (TPUEstimator's internal context's)."""
    return self._internal_ctx.mode

  def __repr__(self):
    system = self._internal_ctx
    where = f"host {self._host_id} of {system.num_hosts}, " if self._call_from_input_fn else ""
    return (f"TPUContext({where}{system.num_replicas} replicas, "
            f"{system.num_of_replicas_per_host} per host, mode={system.mode!r})")


def for_input_fn(input_context, mode=None, hosts=None):
  """The context of one input_fn call: the host of tf.distribute's input_context.

  Args:
    input_context: the tf.distribute.InputContext of the call (or None: one host).
    mode: the ModeKeys value.
    hosts: strategy_hosts() of the strategy; unknown (None) devices when left out.

  Returns:
    A TPUContext whose num_hosts, current_host and num_replicas are the input
    context's num_input_pipelines, input_pipeline_id and num_replicas_in_sync.
  """
  input_context = input_context or tf.distribute.InputContext()
  num_hosts = input_context.num_input_pipelines
  hosts = hosts if hosts is not None else (None,) * num_hosts
  system = StrategySystem(input_context.num_replicas_in_sync, hosts, mode)
  return TPUContext(system, host_id=input_context.input_pipeline_id)


def for_model_fn(num_replicas, hosts, mode):
  """The context a model_fn gets on a TPU: no current host (TPUContext raises if asked)."""
  return TPUContext(StrategySystem(num_replicas, hosts, mode), call_from_input_fn=False)
