"""The TPUEstimator engine: TensorFlow's TPUEstimator (--host_loop off TPU), RunConfig, params.

The model_fn runs on the host CPU/GPU through TF 1 sessions, or with
--use_tpu on every TPU core of a stream-executor TPU (v2-v4).
"""

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.engines import host_loop

KEEP_CHECKPOINTS = 5


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


def build_tpu_estimator(config, params, model_fn, resolver_fn=tpu_cluster_resolver):
  """TPUEstimator (host_loop's, which adds --host_loop off TPU) for config."""
  t, r = config.train, config.runtime
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
      warm_start_from=t.warm_start_from or None)
