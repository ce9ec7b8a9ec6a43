"""The Estimator engine under a strategy: a TPUEstimator model_fn and input_fns in TF 1 sessions.

TPUEstimator cannot take a strategy, so --engine=estimator with
--strategy=mirrored (all local GPUs) or --strategy=multi_worker (a TF_CONFIG
cluster) runs a plain stacks.estimator.Estimator. StrategyEstimator wraps it
so that it takes the same model_fn and input_fns, and offers the same train /
evaluate / predict, as the TPUEstimator.
"""

import os
import warnings

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.engines import calls
from estimator_tpu.engines import strategies
from estimator_tpu.engines import tpu_estimator

ModeKeys = stacks.ModeKeys


def _session_config(strategy):
  """Lets graph sessions see every logical CPU the strategy uses (CPU-only runs)."""
  cpus = [d for d in strategy.extended.worker_devices if "CPU" in d.upper()]
  if len(cpus) < 2:
    return None
  return tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                  device_count={"CPU": len(cpus)})


def build_strategy_estimator(config, params, model_fn):
  """The StrategyEstimator for config.runtime.strategy.

  Raises:
    ConfigError: --strategy=multi_worker without --mode=train or a usable
      TF_CONFIG, or a batch that does not divide over the replicas.
  """
  t, r = config.train, config.runtime
  strategies.check_multi_worker_mode(r)
  strategy = strategies.make_strategy(r.strategy)
  strategies.check_replica_batches(t, r.strategy, strategy.num_replicas_in_sync)
  return StrategyEstimator(
      model_fn, build_strategy_run_config(config, strategy), params,
      t.train_batch_size, t.eval_batch_size, warm_start_from=t.warm_start_from or None)


def build_strategy_run_config(config, strategy):
  """A stacks.estimator.RunConfig that trains (and evaluates) under strategy.

  Multi-worker runs evaluate in a separate --mode=eval job, without a strategy.
  """
  t, r = config.train, config.runtime
  eval_strategy = strategy if r.strategy == "mirrored" else None
  return stacks.estimator.RunConfig(
      model_dir=r.model_dir,
      save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
      keep_checkpoint_max=tpu_estimator.KEEP_CHECKPOINTS,
      tf_random_seed=t.seed or None,
      log_step_count_steps=r.iterations_per_loop,
      train_distribute=strategy,
      eval_distribute=eval_strategy,
      session_config=_session_config(strategy))


def _is_first_local_replica():
  """True on this worker's first device (the replica whose hooks the Estimator runs)."""
  if not tf.distribute.has_strategy():
    return True
  replica_id = tf.get_static_value(
      tf.distribute.get_replica_context().replica_id_in_sync_group)
  local_count = len(tf.distribute.get_strategy().extended.worker_devices)
  return replica_id is None or replica_id % local_count == 0


def _no_host_call(*unused_tensors):
  return tf.no_op()


def as_estimator_model_fn(model_fn, batch_sizes):
  """Adapts a TPUEstimator model_fn to a stacks.estimator.Estimator.

  Args:
    model_fn: model_fn(features, labels, mode, params[, config]) returning a
      TPUEstimatorSpec (or an EstimatorSpec).
    batch_sizes: {mode: global batch size}.

  Returns:
    A model_fn returning an EstimatorSpec. Like TPUEstimator off TPU it sets
    params['use_tpu'] = False and params['batch_size'] (here per replica).
    as_estimator_spec() turns eval_metrics into eval_metric_ops and host_call
    into a hook. The Estimator runs only the first replica's hooks, so only
    that replica writes the host_call summaries: values computed per example
    (train/loss, train/accuracy) cover its share of the batch.
  """

  def estimator_model_fn(features, labels, mode, params, config):
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    params = dict(params, batch_size=batch_sizes[mode] // replicas, use_tpu=False)
    if not config.is_chief and "model_dir" in params:
      # Like the Estimator's own summaries: other workers write beside model_dir.
      params["model_dir"] = os.path.join(
          params["model_dir"], f"tmp_{config.task_type}_{config.task_id}")
    spec = calls.call_model_fn(model_fn, features, labels, mode, params, config)
    if not isinstance(spec, stacks.tpu.TPUEstimatorSpec):
      return spec
    if spec.host_call is not None and not _is_first_local_replica():
      # Same hook structure on every replica, but no second summary writer.
      # Every worker keeps its own: variables are created on all of them.
      spec = stacks.tpu.TPUEstimatorSpec(
          **dict(spec._asdict(), host_call=(_no_host_call, [])))
    return spec.as_estimator_spec()

  return estimator_model_fn


def with_replica_batch(input_fn, params, global_batch_size):
  """input_fn(params) -> an Estimator input_fn(input_context) fed the per-replica batch.

  Under multi_worker each worker keeps every n-th batch (n = workers), so the
  workers train on different examples.
  """

  def replica_input_fn(input_context=None):
    replicas = input_context.num_replicas_in_sync if input_context else 1
    dataset = input_fn(dict(params, batch_size=global_batch_size // replicas))
    if input_context and input_context.num_input_pipelines > 1:
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    return dataset

  return replica_input_fn


def _quiet(method):
  """Runs an Estimator method without tf.data's options warning, which strategies trigger."""

  def quiet_method(*args, **kwargs):
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
      return method(*args, **kwargs)

  return quiet_method


class StrategyEstimator:
  """An Estimator under a tf.distribute strategy that takes TPUEstimator input_fns.

  Input_fns get params['batch_size'] = global batch / replicas, like the
  per-shard batch TPUEstimator gives them on TPU. A wrapper, not a subclass:
  Estimator forbids overriding train/evaluate/predict. Every other attribute
  (model_dir, params, export_saved_model, ...) is the wrapped Estimator's.
  """

  def __init__(self, model_fn, config, params, train_batch_size, eval_batch_size,
               warm_start_from=None):
    self._batch_sizes = {ModeKeys.TRAIN: train_batch_size,
                         ModeKeys.EVAL: eval_batch_size,
                         ModeKeys.PREDICT: eval_batch_size}
    self._trained_to = None
    self.estimator = stacks.estimator.Estimator(
        model_fn=as_estimator_model_fn(model_fn, self._batch_sizes),
        config=config, params=params, warm_start_from=warm_start_from)

  def __getattr__(self, name):
    return getattr(self.estimator, name)

  def _adapt(self, input_fn, mode):
    return with_replica_batch(input_fn, self.estimator.params, self._batch_sizes[mode])

  @_quiet
  def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
    """Estimator.train; with TF_CONFIG, as this worker of the cluster."""
    input_fn = self._adapt(input_fn, ModeKeys.TRAIN)
    if not getattr(self.estimator.config, "_distribute_coordinator_mode", None):
      self.estimator.train(input_fn, hooks=hooks, steps=steps, max_steps=max_steps,
                           saving_listeners=saving_listeners)
      return self
    if steps is not None or max_steps is None:
      raise ValueError("--strategy=multi_worker trains to max_steps, not for steps")
    chief = strategies.is_chief_task(strategies.read_tf_config())
    if self._trained_to is not None and not chief:
      strategies.wait_for_checkpoint(self.estimator.model_dir, self._trained_to)
    # Estimator.train refuses TF_CONFIG clusters; train_and_evaluate runs the
    # distribute coordinator, which trains a copy configured for this worker.
    stacks.estimator.train_and_evaluate(
        self.estimator,
        stacks.estimator.TrainSpec(input_fn, max_steps=max_steps, hooks=hooks,
                               saving_listeners=saving_listeners),
        stacks.estimator.EvalSpec(input_fn, steps=None))  # never run: no evaluator task
    self._trained_to = max_steps
    return self

  @_quiet
  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
    return self.estimator.evaluate(self._adapt(input_fn, ModeKeys.EVAL), steps=steps,
                                   hooks=hooks, checkpoint_path=checkpoint_path, name=name)

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True):
    return self.estimator.predict(self._adapt(input_fn, ModeKeys.PREDICT),
                                  predict_keys=predict_keys, hooks=hooks,
                                  checkpoint_path=checkpoint_path,
                                  yield_single_examples=yield_single_examples)
