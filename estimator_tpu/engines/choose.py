"""The one place that chooses the engine: build_estimator(config) for train.py, and for programs.

--engine=estimator with --strategy=none (the default) gives TPUEstimator
(engines/tpu_estimator.py): the model_fn runs on the host CPU/GPU, or with
--use_tpu on every TPU core. With --strategy=mirrored or multi_worker it gives
the Estimator under that strategy (engines/strategy_estimator.py), because
TPUEstimator cannot take one. --engine=distribute gives the tf.distribute
engine (engines/distribute/). All offer train/evaluate/predict, so the run's
loop does not know which it drives.
"""

import importlib
import logging
import os

import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.engines import host_loop
from estimator_tpu.engines import strategies
from estimator_tpu.engines import strategy_estimator
from estimator_tpu.engines import tpu_estimator
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.model import device_augmentation
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.model import precision

KEEP_CHECKPOINTS = tpu_estimator.KEEP_CHECKPOINTS
tpu_cluster_resolver = tpu_estimator.tpu_cluster_resolver
build_run_config = tpu_estimator.build_run_config
build_params = tpu_estimator.build_params

log = logging.getLogger("estimator_tpu")


def build_estimator(config, class_names=None, model_fn=model_fn_lib.model_fn,
                    resolver_fn=tpu_cluster_resolver):
  """The engine for config: TPUEstimator, StrategyEstimator or DistributeEngine.

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
  r = config.runtime
  try:
    precision.check_host(config.precision, r.use_tpu,
                         len(tf.config.list_physical_devices("GPU")))
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  params = build_params(config, class_names)
  user_model_fn = model_fn
  model_fn = device_augmentation.with_device_augmentation(model_fn)
  if r.engine == "distribute":
    return build_distribute_engine(config, params, model_fn, resolver_fn, user_model_fn)
  if r.engine == "jax":
    return build_jax_engine(config, params, model_fn, user_model_fn)
  if r.strategy != "none":
    return strategy_estimator.build_strategy_estimator(config, params, model_fn)
  return tpu_estimator.build_tpu_estimator(config, params, model_fn, resolver_fn)


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


ENGINE_ENV = "ESTIMATOR_TPU_ENGINE"  # how a program chooses
_ENGINES = ("estimator", "distribute", "jax", "auto")


def chosen_engine(use_tpu, environ=os.environ):
  """'estimator', 'distribute' or 'jax' for a program's TPUEstimator, from ESTIMATOR_TPU_ENGINE."""
  engine = environ.get(ENGINE_ENV, "auto").strip().lower() or "auto"
  if engine not in _ENGINES:
    raise ValueError(f"{ENGINE_ENV}={environ[ENGINE_ENV]!r} is not one of {', '.join(_ENGINES)}")
  if engine == "auto":
    return "distribute" if pjrt_tpu_environment(use_tpu, "", environ) else "estimator"
  return engine


def program_engine(use_tpu, environ=os.environ):
  """The engine of a program's TPUEstimator(use_tpu=...): chosen_engine's answer.

  use_tpu None (a program's subclass sets it in its own __init__, after the
  choice) counts as True: under `auto` only a PJRT TPU chooses the distribute
  engine, and TPUEstimator programs there run with use_tpu.
  """
  return chosen_engine(True if use_tpu is None else use_tpu, environ)


STRATEGY_ENV = "ESTIMATOR_TPU_STRATEGY"  # how a program chooses the engine's strategy
PROGRAM_STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")


def program_strategy_name(use_tpu, environ=os.environ):
  """ESTIMATOR_TPU_STRATEGY's strategy, else 'tpu' for use_tpu, else None (the default).

  Raises:
    ConfigError: a value that is not one of PROGRAM_STRATEGIES.
  """
  value = environ.get(STRATEGY_ENV, "").strip().lower()
  if not value:
    return "tpu" if use_tpu else None
  if value not in PROGRAM_STRATEGIES:
    raise config_lib.ConfigError(
        f"{STRATEGY_ENV}={environ[STRATEGY_ENV]!r} is not one of "
        f"{', '.join(PROGRAM_STRATEGIES)} (unset: every local GPU, else one device)")
  return value


def prepare_program_strategy(environ=os.environ):
  """At a program's start: checks ESTIMATOR_TPU_STRATEGY, and sets up a multi-worker cluster.

  A MultiWorkerMirroredStrategy must be made before TensorFlow runs its
  first op, so a program that asks for one gets it as the compat layer
  starts, not when it builds its TPUEstimator.

  Raises:
    ConfigError: a value not in PROGRAM_STRATEGIES, or one given where
      ESTIMATOR_TPU_ENGINE does not choose the distribute engine (TensorFlow's
      TPUEstimator takes no strategy).
  """
  name = program_strategy_name(False, environ)
  if name is None:
    return
  engine = chosen_engine(True, environ)
  if engine not in ("distribute", "jax"):
    raise config_lib.ConfigError(
        f"{STRATEGY_ENV}={environ[STRATEGY_ENV]} is for {ENGINE_ENV}=distribute or jax: "
        f"TensorFlow's TPUEstimator takes no strategy; set {ENGINE_ENV}=distribute, or unset "
        f"{STRATEGY_ENV}")
  if name == "multi_worker" and engine == "distribute":
    strategies.multi_worker_strategy(f"{STRATEGY_ENV}=multi_worker", environ)


def program_strategy(use_tpu, run_config, environ=os.environ):
  """The distribute engine's strategy for a program's TPUEstimator(use_tpu, config).

  ESTIMATOR_TPU_STRATEGY when set; else TPUStrategy with use_tpu, else
  MirroredStrategy over every local GPU when there are several, else one
  device.
  """
  name = program_strategy_name(use_tpu, environ)
  if name not in _program_strategies:
    _program_strategies[name] = _new_program_strategy(name, run_config, environ)
  return _program_strategies[name]


# One strategy of each kind per process, for every TPUEstimator a program builds: the
# collective ops of two MirroredStrategy objects share instance keys and would clash.
_program_strategies = {}


def _new_program_strategy(name, run_config, environ):
  strategies.quiet_strategy_logs()
  if name == "tpu":
    resolver = run_config.cluster or tf.distribute.cluster_resolver.TPUClusterResolver("local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  if name == "multi_worker":
    return strategies.multi_worker_strategy(f"{STRATEGY_ENV}=multi_worker", environ)
  if name is None:
    return strategies.default_strategy()
  return strategies.make_strategy(name)


def _jax_module(name, asked_by):
  """estimator_tpu.engines.jax.<name>; JAX is imported only by runs that ask for it.

  Raises:
    ConfigError: JAX is not installed.
  """
  try:
    return importlib.import_module(f"estimator_tpu.engines.jax.{name}")
  except ImportError as e:
    if "jax" not in str(e):
      raise
    raise config_lib.ConfigError(
        f"{asked_by} needs JAX, which is not installed here ({e}): install the version this "
        "project's lock pins (requirements/current.lock: jax, jaxlib; jax[cuda13] or jax[tpu] "
        "on accelerators, see docs/TPU_AND_GPUS.md)") from None


def jax_engine_class():
  """The JaxEngine class."""
  return _jax_module("engine", f"{ENGINE_ENV}=jax").JaxEngine


def program_jax_devices(use_tpu, environ=os.environ):
  """The JAX engine's devices for a program's TPUEstimator(use_tpu): ESTIMATOR_TPU_STRATEGY's.

  Raises:
    ConfigError: a strategy the JAX engine does not take, or use_tpu where
      JAX has no TPU.
  """
  jax_devices = _jax_module("devices", f"{ENGINE_ENV}=jax")
  name = program_strategy_name(False, environ) or "none"
  try:
    return jax_devices.for_run("none" if name == "tpu" else name, use_tpu, environ)
  except jax_devices.DeviceError as e:
    raise config_lib.ConfigError(f"{ENGINE_ENV}=jax: {e}") from e


def program_engine_source(environ=os.environ):
  """What chose a program's engine and strategy, for its first line."""
  value = environ.get(STRATEGY_ENV, "").strip()
  return f"{ENGINE_ENV} and {STRATEGY_ENV}={value}" if value else ENGINE_ENV


def make_strategy(config, resolver_fn=tpu_cluster_resolver):
  """The strategy of the distribute engine: TPUStrategy, --strategy's, or the default one."""
  r = config.runtime
  strategies.quiet_strategy_logs()
  if r.use_tpu:
    resolver = resolver_fn(r)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  if r.strategy == "multi_worker":
    strategies.check_multi_worker_mode(r)
    return strategies.multi_worker_strategy()
  if r.strategy == "none":
    return strategies.default_strategy()
  return strategies.make_strategy(r.strategy)


def build_distribute_engine(config, params, model_fn, resolver_fn=tpu_cluster_resolver,
                            export_model_fn=None):
  """The DistributeEngine for config (--engine=distribute).

  Its SavedModel is exported by build_estimator(export_model_fn) off TPU,
  from the engine's checkpoint.
  """
  t, r = config.train, config.runtime
  if r.jit_compile and not r.use_tpu and not stacks.HOST_XLA:
    raise config_lib.ConfigError(
        f"--jit_compile needs XLA for the host, which this stack's TensorFlow ({stacks.NAME}: "
        "the TPU build) lacks; leave it out here, or use the current stack")
  strategy = make_strategy(config, resolver_fn)
  replicas = strategy.num_replicas_in_sync
  if replicas > 1:
    strategies.check_replica_batches(t, r.strategy if not r.use_tpu else "tpu", replicas)
  export_config = config.replace("runtime", use_tpu=False, strategy="none", engine="estimator",
                                 jit_compile=False, use_bfloat16=False).replace(
                                     "model", precision=precision.FLOAT32)
  return distribute_engine.DistributeEngine(
      model_fn, params, strategy, r.model_dir, t.train_batch_size, t.eval_batch_size,
      use_tpu=r.use_tpu, iterations_per_loop=r.iterations_per_loop,
      save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
      jit_compile=r.jit_compile, seed=t.seed or None, warm_start_from=t.warm_start_from or None,
      export_estimator_fn=lambda: _exporter(export_config, params.get("class_names"),
                                            export_model_fn or model_fn))


def build_jax_engine(config, params, model_fn, export_model_fn=None):
  """The JaxEngine for config (--engine=jax): JAX's devices by --strategy (devices.py)."""
  jax_engine = _jax_module("engine", "--engine=jax")
  jax_devices = _jax_module("devices", "--engine=jax")
  t, r = config.train, config.runtime
  try:
    devices = jax_devices.for_run(r.strategy, r.use_tpu, deterministic=t.deterministic)
  except jax_devices.DeviceError as e:
    raise config_lib.ConfigError(str(e)) from e
  export_config = config.replace("runtime", use_tpu=False, strategy="none", engine="estimator",
                                 jit_compile=False, use_bfloat16=False).replace(
                                     "model", precision=precision.FLOAT32)
  try:
    return jax_engine.JaxEngine(
        model_fn, params, r.model_dir, t.train_batch_size, t.eval_batch_size, devices=devices,
        use_tpu=r.use_tpu, iterations_per_loop=r.iterations_per_loop,
        save_checkpoints_steps=t.save_checkpoints_steps or t.steps_per_eval,
        seed=t.seed or None, warm_start_from=t.warm_start_from or None,
        export_estimator_fn=lambda: _exporter(export_config, params.get("class_names"),
                                              export_model_fn or model_fn))
  except ValueError as e:  # a batch that does not divide over the devices
    raise config_lib.ConfigError(f"--engine=jax: {e}") from e


def _exporter(config, class_names, model_fn):
  """The TPUEstimator (off TPU, one process) that exports the distribute engine's checkpoints."""
  with strategies.tf_config_hidden():
    return build_estimator(config, class_names, model_fn=model_fn)


def describe_engine(estimator, runtime):
  """'distribute (MirroredStrategy, 2 replicas)' or 'estimator (TPUEstimator on CPU/GPU)'."""
  if getattr(estimator, "engine_name", None) == "jax":
    return f"jax ({estimator.describe()})"
  if isinstance(estimator, distribute_engine.DistributeEngine):
    return f"distribute ({estimator.describe()})"
  if isinstance(estimator, strategy_estimator.StrategyEstimator):
    strategy = estimator.config.train_distribute
    return (f"estimator (Estimator, {type(strategy).__name__}, "
            f"{strategy.num_replicas_in_sync} replicas)")
  if runtime.use_tpu:
    return f"estimator (TPUEstimator on TPU, {runtime.num_cores} cores)"
  loop = ", host_loop" if host_loop.steps_per_run(estimator) > 1 else ""
  return f"estimator (TPUEstimator on CPU/GPU{loop})"
