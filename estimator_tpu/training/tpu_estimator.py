"""build_estimator(config): the TPUEstimator, or an Estimator with a tf.distribute strategy.

--strategy=none (the default) gives a TPUEstimator: the model_fn runs on the
host CPU/GPU, or with --use_tpu on every TPU core. --strategy=mirrored (all
local GPUs) and --strategy=multi_worker (a TF_CONFIG cluster) give a plain
stacks.estimator.Estimator, because TPUEstimator cannot take a
strategy. Both run the same TPUEstimator model_fn and input_fns, and both
offer train/evaluate/predict, so loop.py does not know which it drives.
"""

import logging

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.training import device_augmentation
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
  model_fn = device_augmentation.with_device_augmentation(model_fn)
  warm_start = t.warm_start_from or None
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
