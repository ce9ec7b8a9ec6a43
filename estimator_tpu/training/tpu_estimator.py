"""build_estimator(config): the TPUEstimator, or an Estimator with a tf.distribute strategy.

--strategy=none (the default) gives a TPUEstimator: the model_fn runs on the
host CPU/GPU, or with --use_tpu on every TPU core. --strategy=mirrored (all
local GPUs) and --strategy=multi_worker (a TF_CONFIG cluster) give a plain
stacks.estimator.Estimator, because TPUEstimator cannot take a
strategy. Both run the same TPUEstimator model_fn and input_fns, and both
offer train/evaluate/predict, so loop.py does not know which it drives.
"""

import logging
import os

import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.training import device_augmentation
from estimator_tpu.training import distribute_engine
from estimator_tpu.training import host_loop
from estimator_tpu.training import model_fn as model_fn_lib
from estimator_tpu.training import strategy_estimator

KEEP_CHECKPOINTS = strategy_estimator.KEEP_CHECKPOINTS

log = logging.getLogger("estimator_tpu")


def tpu_cluster_resolver(runtime):
  """The TPUClusterResolver for --tpu/--tpu_zone/--gcp_project (TPU runs only)."""
  return tf.distribute.cluster_resolver.TPUClusterResolver(
      tpu=runtime.tpu or None, zone=runtime.tpu_zone or None,
      project=runtime.gcp_project or None)


def build_run_config(config, resolver_fn=tpu_cluster_resolver):
  """The stacks.estimator.tpu.RunConfig for config.

  Args:
    config: a validated Config.
    resolver_fn: runtime -> cluster resolver; called only with --use_tpu
      (tests pass a stub).
  """
  t, r = config.train, config.runtime
  cluster = resolver_fn(r) if r.use_tpu else None
  return stacks.tpu.RunConfig(
      cluster=cluster,
      model_dir=r.model_dir,
      save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
      keep_checkpoint_max=KEEP_CHECKPOINTS,
      tf_random_seed=t.seed or None,
      log_step_count_steps=r.iterations_per_loop,
      tpu_config=stacks.tpu.TPUConfig(
          iterations_per_loop=r.iterations_per_loop,
          num_shards=r.num_cores if r.use_tpu else None,
          experimental_host_call_every_n_steps=t.summary_every_n_steps,
          per_host_input_for_training=(
              stacks.tpu.InputPipelineConfig.PER_HOST_V2)))


def build_params(config, class_names=None):
  """config.to_params() plus the class names (basic Python types only)."""
  params = config.to_params()
  if class_names:
    params["class_names"] = [str(name) for name in class_names]
  return params


def build_estimator(config, class_names=None, model_fn=model_fn_lib.model_fn,
                    resolver_fn=tpu_cluster_resolver):
  """The estimator for config: TPUEstimator, or DistributedEstimator with --strategy.

  Args:
    config: a validated Config whose data section is resolved
      (num_label_classes set).
    class_names: names in label order, for the `class` prediction (off TPU).
    model_fn: the TPUEstimator model_fn to run; with --augment_on=device it
      runs behind device_augmentation.with_device_augmentation and still
      gets normalized images.
    resolver_fn: see build_run_config.

  Raises:
    ConfigError: --strategy=multi_worker without a usable TF_CONFIG, or a
      batch that does not divide over the replicas.
  """
  t, r = config.train, config.runtime
  if r.use_bfloat16 and not r.use_tpu:
    log.warning("--use_bfloat16 applies only on TPU; computing in float32 here")
  params = build_params(config, class_names)
  user_model_fn = model_fn
  model_fn = device_augmentation.with_device_augmentation(model_fn)
  warm_start = t.warm_start_from or None
  if r.engine == "distribute":
    return build_distribute_engine(config, params, model_fn, resolver_fn, user_model_fn)
  if r.strategy != "none":
    return strategy_estimator.build_distributed_estimator(config, params, model_fn)
  return host_loop.TPUEstimator(
      model_fn=model_fn,
      config=build_run_config(config, resolver_fn),
      params=params,
      use_tpu=r.use_tpu,
      host_loop=r.host_loop,
      train_batch_size=t.train_batch_size,
      eval_batch_size=t.eval_batch_size,
      predict_batch_size=t.eval_batch_size,
      eval_on_tpu=r.eval_on_tpu,
      export_to_tpu=False,
      warm_start_from=warm_start)


# TPU generations that TensorFlow reaches only through PJRT (no stream-executor runtime).
PJRT_ONLY_TPUS = ("v5", "v6", "v7")


def pjrt_tpu(runtime, environ=os.environ):
  """Whether --use_tpu's TPU runs TensorFlow only through PJRT (v5e, v5p, v6e, Colab/Kaggle)."""
  return pjrt_tpu_environment(runtime.use_tpu, runtime.tpu_topology, environ)


def pjrt_tpu_environment(use_tpu, tpu_topology, environ=os.environ):
  """pjrt_tpu() for a TPU run described by its use_tpu, accelerator type and environment.

  PJRT_DEVICE=TPU is what TensorFlow's TPU builds and Colab/Kaggle set for
  PJRT; TPU_ACCELERATOR_TYPE is set on TPU VMs.
  """
  if not use_tpu:
    return False
  if environ.get("PJRT_DEVICE", "").upper() == "TPU":
    return True
  accelerator = (tpu_topology or environ.get("TPU_ACCELERATOR_TYPE", "")).lower()
  return accelerator.startswith(PJRT_ONLY_TPUS)


def resolve_engine(runtime, environ=os.environ):
  """(engine, why): --engine, or for auto the distribute engine on a PJRT TPU, else estimator."""
  if runtime.engine != "auto":
    return runtime.engine, f"--engine={runtime.engine}"
  if pjrt_tpu(runtime, environ):
    return "distribute", "--engine=auto: the TPU runs TensorFlow through PJRT"
  return "estimator", "--engine=auto"


def make_strategy(config, resolver_fn=tpu_cluster_resolver):
  """The strategy of the distribute engine: TPUStrategy, --strategy's, or the default one."""
  r = config.runtime
  if r.use_tpu:
    resolver = resolver_fn(r)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  if r.strategy != "none":
    strategy_estimator.check_multi_worker_mode(r)
    return strategy_estimator.make_strategy(r.strategy)
  gpus = tf.config.list_logical_devices("GPU")
  return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")


def build_distribute_engine(config, params, model_fn, resolver_fn=tpu_cluster_resolver,
                            export_model_fn=None):
  """The DistributeEstimator for config (--engine=distribute).

  Its SavedModel is exported by build_estimator(export_model_fn) off TPU,
  from the engine's checkpoint.
  """
  t, r = config.train, config.runtime
  if r.strategy != "none" and stacks.NAME == "tf2.15":
    raise config_lib.ConfigError(
        f"--engine=distribute with --strategy={r.strategy} needs TensorFlow 2.16 or later "
        f"(this is {stacks.NAME}: its TF 1 optimizers lose their slots across replicas); use "
        "--engine=estimator here, or the current stack")
  if r.jit_compile and not r.use_tpu and not stacks.HOST_XLA:
    raise config_lib.ConfigError(
        f"--jit_compile needs XLA for the host, which this stack's TensorFlow ({stacks.NAME}: "
        "the TPU build) lacks; leave it out here, or use the current stack")
  strategy = make_strategy(config, resolver_fn)
  replicas = strategy.num_replicas_in_sync
  if replicas > 1:
    strategy_estimator.check_replica_batches(t, r.strategy if not r.use_tpu else "tpu", replicas)
  export_config = config.replace("runtime", use_tpu=False, strategy="none", engine="estimator",
                                 jit_compile=False)
  return distribute_engine.DistributeEstimator(
      model_fn, params, strategy, r.model_dir, t.train_batch_size, t.eval_batch_size,
      use_tpu=r.use_tpu, iterations_per_loop=r.iterations_per_loop,
      save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
      jit_compile=r.jit_compile, seed=t.seed or None, warm_start_from=t.warm_start_from or None,
      export_estimator_fn=lambda: build_estimator(
          export_config, params.get("class_names"), model_fn=export_model_fn or model_fn))


def describe_engine(estimator, runtime):
  """'distribute (MirroredStrategy, 2 replicas)' or 'estimator (TPUEstimator on CPU/GPU)'."""
  if isinstance(estimator, distribute_engine.DistributeEstimator):
    return f"distribute ({estimator.describe()})"
  if isinstance(estimator, strategy_estimator.DistributedEstimator):
    strategy = estimator.config.train_distribute
    return (f"estimator (Estimator, {type(strategy).__name__}, "
            f"{strategy.num_replicas_in_sync} replicas)")
  if runtime.use_tpu:
    return f"estimator (TPUEstimator on TPU, {runtime.num_cores} cores)"
  loop = ", host_loop" if host_loop.steps_per_run(estimator) > 1 else ""
  return f"estimator (TPUEstimator on CPU/GPU{loop})"
