"""Stand-in for `tensorflow.python.distribute.estimator_training`: the Estimator's
distribute-coordinator entry points, on TensorFlow's own coordinator.

The estimator calls five functions: `init_run_config` (from RunConfig with a
train/eval strategy), `should_run_distribute_coordinator` and
`train_and_evaluate` (from tf.estimator.train_and_evaluate), `estimator_train`
and `estimator_evaluate` (from Estimator.train/evaluate in STANDALONE_CLIENT
mode). TensorFlow 2.21 still ships the coordinator itself
(`distribute_coordinator.run_distribute_coordinator`), so every function here
is real behaviour: each task of a TF_CONFIG cluster runs a copy of the
estimator configured from its worker context.
"""

import copy
import logging

from tensorflow.python.distribute import distribute_coordinator as dc
from tensorflow.python.distribute import distribute_coordinator_context as dc_context
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.training import server_lib

from estimator_tpu import keras_loaders

# The estimator imports this module, in the thread that imports the estimator, before the
# coordinator and MirroredStrategy start their task and replica threads, whose model_fns would
# otherwise race for `tf.compat.v1.keras` on first use (estimator_tpu/keras_loaders.py).
keras_loaders.settle()

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
_MODES = (dc.CoordinatorMode.STANDALONE_CLIENT, dc.CoordinatorMode.INDEPENDENT_WORKER)

log = logging.getLogger("estimator_tpu")


def _task_order(cluster_spec):
  """Job names in global-id order: chief, the other jobs sorted, ps last."""
  jobs = set(cluster_spec.jobs)
  middle = sorted(jobs - {CHIEF, PS})
  return [j for j in [CHIEF] if j in jobs] + middle + [j for j in [PS] if j in jobs]


def global_id(cluster_spec, task_type, task_id):
  """This task's index over the whole cluster (0 for a local run)."""
  if not task_type:
    return 0
  offset = 0
  for job in _task_order(cluster_spec):
    if job == task_type:
      return offset + task_id
    offset += len(cluster_spec.job_tasks(job))
  raise ValueError(f"task type {task_type!r} is not a job of the cluster {cluster_spec.as_dict()}")


def configure_from_worker_context(config, context):
  """Points a RunConfig copy at one task: its cluster, role, master and counts."""
  config._service = None
  config._task_type, config._task_id = context.task_type, context.task_id
  config._master = config._evaluation_master = context.master_target
  config._is_chief = context.is_chief
  cluster = context.cluster_spec
  if not cluster:
    config._cluster_spec = cluster
    config._num_ps_replicas, config._num_worker_replicas = 0, 1
    config._global_id_in_cluster = 0
  elif config._task_type == EVALUATOR:
    # The evaluator runs on its own, outside the training cluster.
    config._cluster_spec = server_lib.ClusterSpec({})
    config._num_ps_replicas, config._num_worker_replicas = 0, 0
    config._global_id_in_cluster = None
  else:
    jobs = cluster.as_dict()
    config._cluster_spec = cluster
    config._num_ps_replicas = len(jobs.get(PS, []))
    config._num_worker_replicas = len(jobs.get(WORKER, [])) + len(jobs.get(CHIEF, []))
    config._global_id_in_cluster = global_id(cluster, config._task_type, config._task_id)


def _take_experimental_distribute(config):
  """Moves experimental_distribute's strategies into train/eval_distribute."""
  experimental = config._experimental_distribute
  if not experimental:
    return
  for name in ("train_distribute", "eval_distribute"):
    strategy = getattr(experimental, name, None)
    if strategy is None:
      continue
    if getattr(config, "_" + name):
      raise ValueError(f"set either `{name}` or `experimental_distribute.{name}`, not both")
    setattr(config, "_" + name, strategy)


def init_run_config(config, tf_config):
  """Sets up a RunConfig built with a distribution strategy.

  A TF_CONFIG cluster (without a 'master' job) and a train strategy make every
  task run the coordinator itself (INDEPENDENT_WORKER); a remote cluster given
  through experimental_distribute makes this process a STANDALONE_CLIENT;
  anything else is the RunConfig's usual TF_CONFIG handling.
  """
  _take_experimental_distribute(config)
  cluster_spec = server_lib.ClusterSpec(tf_config.get("cluster", {}))
  config._init_distributed_setting_from_environment_var({})
  remote = getattr(config._experimental_distribute, "remote_cluster", None)
  if config._train_distribute and remote:
    if cluster_spec:
      raise ValueError("set either TF_CONFIG's cluster or "
                       "`experimental_distribute.remote_cluster`, not both")
    config._distribute_coordinator_mode = dc.CoordinatorMode.STANDALONE_CLIENT
    config._cluster_spec = remote
    return
  if not cluster_spec or "master" in cluster_spec.jobs or not config._train_distribute:
    config._distribute_coordinator_mode = None
    config._init_distributed_setting_from_environment_var(tf_config)
    config._maybe_overwrite_session_config_for_distributed_training()
    return
  config._cluster_spec = cluster_spec
  config._distribute_coordinator_mode = dc.CoordinatorMode.INDEPENDENT_WORKER


def should_run_distribute_coordinator(config):
  """Whether train_and_evaluate must go through the coordinator."""
  mode = getattr(config, "_distribute_coordinator_mode", None)
  if mode is None:
    return False
  if mode not in _MODES:
    log.warning("ignoring unknown distribute_coordinator_mode %r", mode)
    return False
  return bool(config.cluster_spec)


def _local_copy(estimator, strategy, for_training):
  """A copy of estimator configured for the task whose worker context is current."""
  local = copy.deepcopy(estimator)
  if for_training:
    local._config._train_distribute = strategy
    local._train_distribution = strategy
  else:
    local._config._eval_distribute = strategy
    local._eval_distribution = strategy
  configure_from_worker_context(local._config, dc_context.get_current_worker_context())
  local._config._distribute_coordinator_mode = None
  return local


def train_and_evaluate(estimator, train_spec, eval_spec, executor_cls):
  """tf.estimator.train_and_evaluate for a cluster: workers train, an evaluator evaluates."""
  run_config = estimator.config
  mode = run_config._distribute_coordinator_mode
  if not mode:
    raise ValueError("the RunConfig names no distribute coordinator mode")

  def worker_fn(strategy):
    local = _local_copy(estimator, strategy, for_training=True)
    is_chief = dc_context.get_current_worker_context().is_chief
    hooks = list(train_spec.hooks) if (
        mode == dc.CoordinatorMode.INDEPENDENT_WORKER or is_chief) else []
    local.train(input_fn=train_spec.input_fn, max_steps=train_spec.max_steps, hooks=hooks)

  def eval_fn(strategy):
    local = _local_copy(estimator, strategy, for_training=False)
    executor_cls(local, train_spec, eval_spec)._start_continuous_evaluation()

  standalone = mode == dc.CoordinatorMode.STANDALONE_CLIENT
  dc.run_distribute_coordinator(
      worker_fn, run_config.train_distribute, eval_fn, run_config.eval_distribute,
      mode=mode, cluster_spec=run_config.cluster_spec if standalone else None,
      session_config=run_config.session_config)


def _run_standalone(estimator, strategy, method, role_fn):
  """Runs role_fn(local_estimator, strategy) on every task of a STANDALONE_CLIENT run."""
  config = estimator._config
  cluster_spec = multi_worker_util.normalize_cluster_spec(config.cluster_spec)
  if EVALUATOR in cluster_spec.jobs:
    raise ValueError(f"an 'evaluator' job needs tf.estimator.train_and_evaluate, "
                     f"not Estimator.{method}")
  if config._distribute_coordinator_mode != dc.CoordinatorMode.STANDALONE_CLIENT:
    raise ValueError(f"Estimator.{method} on a cluster needs STANDALONE_CLIENT mode "
                     f"(experimental_distribute.remote_cluster); with TF_CONFIG on "
                     f"every task use tf.estimator.train_and_evaluate")
  if strategy.extended.experimental_between_graph:
    raise ValueError(f"Estimator.{method} cannot run {type(strategy).__name__} "
                     f"as a STANDALONE_CLIENT")
  return dc.run_distribute_coordinator(
      role_fn, strategy, mode=config._distribute_coordinator_mode,
      cluster_spec=cluster_spec, session_config=config.session_config)


def estimator_train(estimator, train_distributed_fn, hooks):
  """Estimator.train on a remote cluster; the chief alone runs the caller's hooks."""

  def worker_fn(strategy):
    local = _local_copy(estimator, strategy, for_training=True)
    is_chief = dc_context.get_current_worker_context().is_chief
    train_distributed_fn(local, strategy, hooks if is_chief else [])
    return local

  return _run_standalone(estimator, estimator._config._train_distribute,
                         "train", worker_fn)


def estimator_evaluate(estimator, evaluate_distributed_fn, hooks):
  """Estimator.evaluate on a remote cluster; the chief alone runs the caller's hooks."""

  def worker_fn(strategy):
    local = _local_copy(estimator, strategy, for_training=False)
    is_chief = dc_context.get_current_worker_context().is_chief
    return evaluate_distributed_fn(local, strategy, hooks if is_chief else [])

  return _run_standalone(estimator, estimator._config._eval_distribute,
                         "evaluate", worker_fn)
