"""tf.distribute strategies for the engines: devices, TF_CONFIG's cluster and chief, batches.

Off TPU the distribute engine's default strategy is a MirroredStrategy over
every local GPU when there are several, else a OneDeviceStrategy (the GPU,
or the CPU). `mirrored` asked for by name replicates over every GPU, or,
with none, over every logical CPU device the process configured (tests and
CI stand in several CPUs for several GPUs). `multi_worker` is a
MultiWorkerMirroredStrategy over TF_CONFIG's cluster, made once per process
before TensorFlow runs its first op (collective ops are set up then).
"""

import contextlib
import json
import logging
import os
import time

import tensorflow as tf

from estimator_tpu import config as config_lib

TF_CONFIG = "TF_CONFIG"
CHIEF_CHECKPOINT_TIMEOUT_SECS = 600
_multi_worker = []  # the process's MultiWorkerMirroredStrategy, made once


class _StrategyChatter(logging.Filter):
  """Drops tf.distribute's own INFO records ("Collective all_reduce tensors: 8 all_reduces, ...").

  A program that sets TF's verbosity to INFO reads the estimator's lines; the
  strategy's bookkeeping, at every trace, is not among them (the engine's
  first line names the strategy and its replicas).
  """

  _OWN = os.path.join("tensorflow", "python", "distribute", "")

  def filter(self, record):
    return record.levelno > logging.INFO or self._OWN not in record.pathname


_CHATTER = _StrategyChatter()


def quiet_strategy_logs():
  """Keeps tf.distribute's INFO records out of TensorFlow's log (once per process)."""
  logger = tf.get_logger()
  if _CHATTER not in logger.filters:
    logger.addFilter(_CHATTER)


def local_devices():
  """The devices a MirroredStrategy replicates over: all GPUs, else all logical CPUs."""
  gpus = tf.config.list_logical_devices("GPU")
  return [device.name for device in gpus or tf.config.list_logical_devices("CPU")]


def strategy_name(strategy):
  """The strategy's public name (tf.distribute.MultiWorkerMirroredStrategy's class is
  CollectiveAllReduceStrategy)."""
  name = type(strategy).__name__
  return "MultiWorkerMirroredStrategy" if name == "CollectiveAllReduceStrategy" else name


def one_device_strategy():
  """OneDeviceStrategy on the first GPU, else on the CPU."""
  gpus = tf.config.list_logical_devices("GPU")
  return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")


def default_strategy():
  """The distribute engine's strategy off TPU when none is asked for.

  A MirroredStrategy over every local GPU when there are several, else one
  device. Logical CPU devices are not used unasked: `mirrored` uses them.
  """
  gpus = tf.config.list_logical_devices("GPU")
  if len(gpus) > 1:
    return tf.distribute.MirroredStrategy(devices=[gpu.name for gpu in gpus])
  return one_device_strategy()


def multi_worker_strategy(asked_by="--strategy=multi_worker", environ=os.environ):
  """The process's MultiWorkerMirroredStrategy over TF_CONFIG's cluster (made on first call).

  It must be made before TensorFlow runs its first op: collective ops and
  the coordination service are configured as the runtime starts.

  Args:
    asked_by: how the run asked for it, for the messages.
    environ: where TF_CONFIG is read.

  Raises:
    ConfigError: no usable TF_CONFIG, or TensorFlow already started.
  """
  if _multi_worker:
    return _multi_worker[0]
  read_tf_config(environ, asked_by)
  try:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  except RuntimeError as e:
    if "must be configured at program startup" not in str(e):
      raise
    raise config_lib.ConfigError(
        f"{asked_by} must set up its cluster before TensorFlow runs its first op, and this "
        "process has run one already: make the strategy first (for a program, set "
        "ESTIMATOR_TPU_STRATEGY=multi_worker before it imports estimator_tpu.compat)") from e
  _multi_worker.append(strategy)
  return strategy


def read_tf_config(environ=os.environ, asked_by="--strategy=multi_worker"):
  """The parsed TF_CONFIG of a multi-worker run; ConfigError names what is missing."""
  example = ('TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
             '"task": {"type": "worker", "index": 0}}\'')
  text = environ.get(TF_CONFIG, "")
  if not text:
    raise config_lib.ConfigError(
        f"{asked_by} needs the {TF_CONFIG} environment variable on every "
        f"worker, e.g. {example}")
  try:
    tf_config = json.loads(text)
  except json.JSONDecodeError as e:
    raise config_lib.ConfigError(f"{TF_CONFIG} is not valid JSON ({e}); e.g. {example}") from e
  if not tf_config.get("cluster") or "type" not in tf_config.get("task", {}):
    raise config_lib.ConfigError(
        f"{TF_CONFIG} needs both 'cluster' and 'task' entries; e.g. {example}")
  return tf_config


def is_chief_task(tf_config):
  """Whether TF_CONFIG's task is the chief: task 'chief', else worker 0."""
  task = tf_config["task"]
  if "chief" in tf_config["cluster"]:
    return task["type"] == "chief"
  return task["type"] == "worker" and int(task.get("index", 0)) == 0


def writes_checkpoints(runtime):
  """Whether this process writes the run's checkpoints: always, but on a non-chief worker."""
  return runtime.strategy != "multi_worker" or is_chief_task(read_tf_config())


def engine_cluster(runtime):
  """Whether the run is a worker of a multi-worker run on the distribute engine."""
  return runtime.strategy == "multi_worker" and runtime.engine == "distribute"


def check_multi_worker_mode(runtime):
  """Multi-worker runs train; on the distribute engine they may evaluate as they go.

  The Estimator's workers only train (each evaluating would duplicate the
  work); the distribute engine's evaluate together, each its share of the
  eval set. Neither follows checkpoints (--mode=eval) as a cluster.
  """
  allowed = ("train", "train_and_eval") if runtime.engine == "distribute" else ("train",)
  if runtime.strategy == "multi_worker" and runtime.mode not in allowed:
    raise config_lib.ConfigError(
        f"--strategy=multi_worker needs --mode={' or '.join(allowed)} on every worker (not "
        f"--mode={runtime.mode}); evaluate with one more process running --mode=eval "
        f"--strategy=none on the same --model_dir, without {TF_CONFIG}")


def make_strategy(name):
  """The tf.distribute strategy for --strategy=one_device, mirrored or multi_worker."""
  if name == "one_device":
    return one_device_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy(devices=local_devices())
  if name == "multi_worker":
    read_tf_config()
    return tf.distribute.MultiWorkerMirroredStrategy()
  raise config_lib.ConfigError(
      f"--strategy={name} is not one of {', '.join(config_lib.STRATEGIES)}")


def check_replica_batches(train, strategy_name, num_replicas):
  """Each replica gets an equal share of both global batches; else ConfigError."""
  named = (f"--strategy={strategy_name}" if strategy_name != "none"
           else "the default strategy (every local GPU)")
  errors = config_lib.batch_share_errors(train, num_replicas,
                                         f"the {num_replicas} replicas of {named}")
  if errors:
    raise config_lib.ConfigError(next(iter(errors.values())))


def check_global_batches(batches, strategy):
  """TPUEstimator's global batch sizes split evenly over the strategy's replicas; else ConfigError.

  Args:
    batches: {argument name: global batch size or None}, e.g.
      {'train_batch_size': 32, 'eval_batch_size': 8}.
    strategy: the tf.distribute strategy the batches split over.
  """
  replicas = strategy.num_replicas_in_sync
  for name, value in batches.items():
    if value and value % replicas:
      lower = value - value % replicas
      fix = f"try {lower} or {lower + replicas}" if lower else f"try {replicas}"
      raise config_lib.ConfigError(
          f"{name}={value} does not divide over the {replicas} replicas of "
          f"{strategy_name(strategy)} (batch sizes are global: each replica's "
          f"params['batch_size'] is an equal share); {fix}")


def checkpoint_step(model_dir):
  """The global step of the latest checkpoint in model_dir, or -1 when there is none."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    return -1
  return int(tf.train.load_variable(checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP))


def wait_for_checkpoint(model_dir, step, timeout_secs=CHIEF_CHECKPOINT_TIMEOUT_SECS):
  """Blocks until the chief's checkpoint in model_dir reaches step.

  A resumed multi-worker session must restore the same checkpoint on every
  worker: a worker that initializes instead waits forever for the chief's
  initial values (tensorflow/tensorflow#45839). The chief writes its last
  checkpoint as a session ends, so the other workers wait for it.

  Raises:
    RuntimeError: no such checkpoint within timeout_secs.
  """
  deadline = time.time() + timeout_secs
  while checkpoint_step(model_dir) < step:
    if time.time() > deadline:
      raise RuntimeError(
          f"the chief's checkpoint in --model_dir={model_dir} did not reach step {step} "
          f"in {timeout_secs}s; every worker needs the same --model_dir (e.g. gs://...)")
    time.sleep(0.5)


@contextlib.contextmanager
def tf_config_hidden(environ=os.environ):
  """Within, no TF_CONFIG: an estimator that only exports reads no cluster.

  The Estimator's RunConfig reads TF_CONFIG when made, and refuses a cluster
  without a `chief` task (MultiWorkerMirroredStrategy's worker-only
  clusters); the exporter runs on one process and needs none.
  """
  saved = environ.pop(TF_CONFIG, None)
  try:
    yield
  finally:
    if saved is not None:
      environ[TF_CONFIG] = saved
