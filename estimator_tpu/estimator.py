"""build_estimator(config): RunConfig, TPUConfig, cluster resolver and TPUEstimator."""

import logging

import tensorflow as tf

from estimator_tpu import model_fn as model_fn_lib

KEEP_CHECKPOINTS = 5

log = logging.getLogger("estimator_tpu")


def tpu_cluster_resolver(runtime):
  """The TPUClusterResolver for --tpu/--tpu_zone/--gcp_project (TPU runs only)."""
  return tf.distribute.cluster_resolver.TPUClusterResolver(
      tpu=runtime.tpu or None, zone=runtime.tpu_zone or None,
      project=runtime.gcp_project or None)


def build_run_config(config, resolver_fn=tpu_cluster_resolver):
  """The tf.estimator.tpu.RunConfig for config.

  Args:
    config: a validated Config.
    resolver_fn: runtime -> cluster resolver; called only with --use_tpu
      (tests pass a stub).
  """
  t, r = config.train, config.runtime
  cluster = resolver_fn(r) if r.use_tpu else None
  return tf.compat.v1.estimator.tpu.RunConfig(
      cluster=cluster,
      model_dir=r.model_dir,
      save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
      keep_checkpoint_max=KEEP_CHECKPOINTS,
      tf_random_seed=t.seed or None,
      log_step_count_steps=r.iterations_per_loop,
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
          iterations_per_loop=r.iterations_per_loop,
          num_shards=r.num_cores if r.use_tpu else None,
          per_host_input_for_training=(
              tf.compat.v1.estimator.tpu.InputPipelineConfig.PER_HOST_V2)))


def build_params(config, class_names=None):
  """config.to_params() plus the class names (basic Python types only)."""
  params = config.to_params()
  if class_names:
    params["class_names"] = [str(name) for name in class_names]
  return params


def build_estimator(config, class_names=None, model_fn=model_fn_lib.model_fn,
                    resolver_fn=tpu_cluster_resolver):
  """The TPUEstimator for config; on CPU/GPU it runs the same model_fn unchanged.

  Args:
    config: a validated Config whose data section is resolved
      (num_label_classes set).
    class_names: names in label order, for the `class` prediction (off TPU).
    model_fn: the TPUEstimator model_fn to run.
    resolver_fn: see build_run_config.
  """
  t, r = config.train, config.runtime
  if r.use_bfloat16 and not r.use_tpu:
    log.warning("--use_bfloat16 applies only on TPU; computing in float32 here")
  warm_start = t.warm_start_from or None
  return tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn,
      config=build_run_config(config, resolver_fn),
      params=build_params(config, class_names),
      use_tpu=r.use_tpu,
      train_batch_size=t.train_batch_size,
      eval_batch_size=t.eval_batch_size,
      predict_batch_size=t.eval_batch_size,
      eval_on_tpu=r.eval_on_tpu,
      export_to_tpu=False,
      warm_start_from=warm_start)
