"""tf.contrib.tpu.TPUEstimator that runs on the engine ESTIMATOR_TPU_ENGINE names.

A TPUEstimator program builds `tf.contrib.tpu.TPUEstimator(...)` itself. With
`ESTIMATOR_TPU_ENGINE=distribute` (or `auto` on a TPU that runs TensorFlow
through PJRT: v5e, v5p, v6e) the same call gives the distribute engine
(engines/distribute/engine.py) with the program's model_fn, params, batch
sizes and RunConfig, offering train / evaluate / predict / export_saved_model;
otherwise (the default) it is TensorFlow's TPUEstimator. Without the
variable (or with `estimator`), nothing is replaced: the programs get
TensorFlow's TPUEstimator itself.
"""

import os

from tensorflow_estimator.python.estimator.tpu import tpu_estimator

from estimator_tpu.engines import choose
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.run import loop

ENGINE_ENV = choose.ENGINE_ENV
chosen_engine = choose.chosen_engine
_TPUEstimator = tpu_estimator.TPUEstimator


def _warm_start_path(warm_start_from):
  if warm_start_from is None or isinstance(warm_start_from, str):
    return warm_start_from
  return warm_start_from.ckpt_to_initialize_from  # WarmStartSettings


# The estimator API modules TF 1 programs reach TPUEstimator through
# (tf.estimator.tpu, tf.compat.v1.estimator.tpu, tensorflow.compat.v1.estimator;
# on TF 2.15 the last is TensorFlow's own API tree, the second name here).
_V1_TPU_APIS = ("tensorflow_estimator._api.v1.estimator.tpu",
                "tensorflow_estimator.python.estimator.api._v1.estimator.tpu")


def route_estimator_api(environ=os.environ):
  """Under ESTIMATOR_TPU_ENGINE=distribute (or auto on a PJRT TPU), TPUEstimator is this one.

  The estimator API module is where tf.estimator.tpu, tf.compat.v1.estimator.tpu,
  tensorflow.compat.v1.estimator and the compat layer's tf.contrib.tpu find
  it; otherwise that module is left as TensorFlow made it.
  """
  if chosen_engine(True, environ) != "distribute":
    return False
  import importlib
  for name in _V1_TPU_APIS:
    try:
      module = importlib.import_module(name)
    except ImportError:  # not in this stack's tensorflow_estimator
      continue
    module.TPUEstimator = TPUEstimator
  return True


class TPUEstimator(_TPUEstimator):
  """TPUEstimator, or under ESTIMATOR_TPU_ENGINE=distribute the distribute engine."""

  def __new__(cls, model_fn=None, model_dir=None, config=None, params=None, use_tpu=True,
              train_batch_size=None, eval_batch_size=None, predict_batch_size=None,
              batch_axis=None, eval_on_tpu=True, export_to_tpu=True, export_to_cpu=True,
              warm_start_from=None, **kwargs):
    # A program's own subclass keeps the estimator: it may override what the engine lacks.
    if cls is not TPUEstimator or chosen_engine(use_tpu) == "estimator":
      return super().__new__(cls)
    import tensorflow as tf
    run_config = config or tf.compat.v1.estimator.tpu.RunConfig()
    model_dir = model_dir or run_config.model_dir
    if not model_dir:
      raise ValueError("TPUEstimator needs a model_dir (or RunConfig(model_dir=...)) to run "
                       f"on {ENGINE_ENV}=distribute")
    tpu_config = run_config.tpu_config

    def exporter():
      return _TPUEstimator(model_fn=model_fn, model_dir=model_dir, config=run_config,
                           params=params, use_tpu=False, train_batch_size=train_batch_size,
                           eval_batch_size=eval_batch_size,
                           predict_batch_size=predict_batch_size, export_to_tpu=False,
                           **kwargs)

    engine = distribute_engine.DistributeEngine(
        model_fn, dict(params or {}), choose.program_strategy(use_tpu, run_config), model_dir,
        train_batch_size, eval_batch_size or train_batch_size,
        predict_batch_size or eval_batch_size or train_batch_size, use_tpu=use_tpu,
        iterations_per_loop=int(tpu_config.iterations_per_loop),
        save_checkpoints_steps=run_config.save_checkpoints_steps or distribute_engine.SAVE_AT_END,
        seed=run_config.tf_random_seed, warm_start_from=_warm_start_path(warm_start_from),
        export_estimator_fn=exporter, run_config=run_config,
        keep_checkpoint_max=run_config.keep_checkpoint_max,
        save_checkpoints_secs=run_config.save_checkpoints_secs)
    loop.say(f"engine: distribute ({engine.describe()}), from {choose.program_engine_source()}")
    return engine

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    on_tpu = getattr(getattr(self, "_ctx", None), "_use_tpu", False)
    loop.say(f"engine: estimator (TPUEstimator on {'TPU' if on_tpu else 'CPU/GPU'})")
