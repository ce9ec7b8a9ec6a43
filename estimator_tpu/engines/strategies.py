"""tf.distribute strategies for the engines: devices, TF_CONFIG's cluster and chief, batches."""

import json
import os
import time

import tensorflow as tf

from estimator_tpu import config as config_lib

TF_CONFIG = "TF_CONFIG"
CHIEF_CHECKPOINT_TIMEOUT_SECS = 600


def local_devices():
  """The devices a MirroredStrategy replicates over: all GPUs, else all logical CPUs."""
  gpus = tf.config.list_logical_devices("GPU")
  return [device.name for device in gpus or tf.config.list_logical_devices("CPU")]


def read_tf_config(environ=os.environ):
  """The parsed TF_CONFIG of a multi-worker run; ConfigError names what is missing."""
  example = ('TF_CONFIG=\'{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
             '"task": {"type": "worker", "index": 0}}\'')
  text = environ.get(TF_CONFIG, "")
  if not text:
    raise config_lib.ConfigError(
        f"--strategy=multi_worker needs the {TF_CONFIG} environment variable on every "
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


def check_multi_worker_mode(runtime):
  """Multi-worker runs only train: each worker evaluating would duplicate the work."""
  if runtime.strategy == "multi_worker" and runtime.mode != "train":
    raise config_lib.ConfigError(
        f"--strategy=multi_worker needs --mode=train on every worker (not "
        f"--mode={runtime.mode}); evaluate with one more process running --mode=eval "
        f"--strategy=none on the same --model_dir, without {TF_CONFIG}")


def make_strategy(name):
  """The tf.distribute strategy for --strategy=mirrored or multi_worker."""
  if name == "mirrored":
    return tf.distribute.MirroredStrategy(devices=local_devices())
  if name == "multi_worker":
    read_tf_config()
    return tf.distribute.MultiWorkerMirroredStrategy()
  raise config_lib.ConfigError(
      f"--strategy={name} is not one of {', '.join(config_lib.STRATEGIES)}")


def check_replica_batches(train, strategy_name, num_replicas):
  """Each replica gets an equal share of both global batches; else ConfigError."""
  errors = config_lib.batch_share_errors(
      train, num_replicas, f"the {num_replicas} replicas of --strategy={strategy_name}")
  if errors:
    raise config_lib.ConfigError(next(iter(errors.values())))


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
