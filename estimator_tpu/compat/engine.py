"""TPUEstimator on the distribute engine: what a program's TPUEstimator(...) is under the engine.

With `ESTIMATOR_TPU_ENGINE=distribute` (or `auto` on a TPU that runs
TensorFlow through PJRT: v5e, v5p, v6e), TensorFlow's own TPUEstimator class,
whatever path the program reached it by (estimator_tpu.compat.routing),
constructs an `EngineTPUEstimator` instead: a TPUEstimator subclass that runs
the program's model_fn, params, batch sizes and RunConfig on the distribute
engine (engines/distribute/engine.py). Otherwise nothing changes: the program
gets TensorFlow's TPUEstimator itself.

- It takes TPUEstimator's arguments and checks them as TPUEstimator does (a
  tpu_config.RunConfig, no reserved params keys, the model_fn's arguments,
  model_dir from the RunConfig or a temporary one), and refuses, in one line
  each, what the engine cannot run: model parallelism (and with it spatial
  partitioning), TPU embeddings, a batch_axis, a WarmStartSettings beyond its checkpoint.
- It is a TPUEstimator (and an Estimator), for `isinstance`. `train`,
  `evaluate`, `predict`, the exports and `model_fn` are the engine's, run in
  the engine's eager context (engines/distribute/eager.py) while the program
  stays in TF 1 graph mode; `model_dir`, `config`, `params`, `eval_dir`, `latest_checkpoint` and
  `get_variable_*` are TensorFlow's own, over the same model_dir, RunConfig and
  params. A public member the engine lacks is refused with its name, never
  run by TensorFlow's TPUEstimator over state it does not have.
- A program's subclass of TPUEstimator gets the engine beneath it
  (`routed_class`): its `__init__`, added methods and overrides of public
  members run, and `super()` reaches the engine. Estimator's own rule holds
  as on the estimator (a subclass not named TPUEstimator may not override
  Estimator's members), and an override of a private member of
  TPUEstimator/Estimator, which the engine never calls, is refused by name.
"""

import copy
import functools
import inspect

from tensorflow_estimator.python.estimator import estimator as estimator_lib
from tensorflow_estimator.python.estimator.tpu import tpu_config
from tensorflow_estimator.python.estimator.tpu import tpu_estimator

from estimator_tpu.engines import choose
from estimator_tpu.engines.distribute import eager
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.run import loop

ENGINE_ENV = choose.ENGINE_ENV
_TPUEstimator = tpu_estimator.TPUEstimator
# TensorFlow's own implementations of these read only model_dir, the RunConfig and params.
_TENSORFLOWS_OWN = frozenset({"model_dir", "config", "params", "eval_dir", "latest_checkpoint",
                              "get_variable_value", "get_variable_names"})
# Class attributes of Estimator that name its API; overriding them changes no behaviour.
_API_NAMES = frozenset({"_estimator_api_names", "_estimator_api_names_v1",
                        "_estimator_api_constants", "_estimator_api_constants_v1",
                        "_tf_api_names", "_tf_api_names_v1", "_tf_docs_inheritable_header"})
_ESTIMATOR_INSTEAD = f"run it with {ENGINE_ENV}=estimator"
_EXPORTS = ("export_saved_model", "export_savedmodel", "experimental_export_all_saved_models")


class EngineRefusal(ValueError):
  """What the distribute engine cannot run; the message names it and the way out, in one line."""


class EngineTPUEstimator(_TPUEstimator):
  """TPUEstimator whose train/evaluate/predict/export run on the distribute engine.

  Takes TPUEstimator's arguments (TF 2.15).
  """

  def __init__(self, model_fn=None, model_dir=None, config=None, params=None, use_tpu=True,
               train_batch_size=None, eval_batch_size=None, predict_batch_size=None,
               batch_axis=None, eval_on_tpu=True, export_to_tpu=True, export_to_cpu=True,
               warm_start_from=None, embedding_config_spec=None, **kwargs):
    program_class = _program_class(type(self))
    # Estimator's own check, on the class the program wrote (as Estimator.__init__ runs it).
    probe = object.__new__(program_class)
    type(probe)._assert_members_are_not_overridden(probe)  # pylint: disable=protected-access
    _check_arguments(model_fn, config, params, use_tpu, train_batch_size)
    _refuse_what_the_engine_lacks(config, use_tpu, batch_axis, embedding_config_spec,
                                  warm_start_from)
    run_config = estimator_lib.maybe_overwrite_model_dir_and_session_config(config, model_dir)
    # What TensorFlow's own members (_TENSORFLOWS_OWN) read.
    self._config = run_config
    self._model_dir = run_config.model_dir
    self._params = copy.deepcopy(params or {})
    self._model_fn = model_fn
    exporter = functools.partial(
        routing_construct, _TPUEstimator, model_fn=model_fn, config=run_config,
        params=params, use_tpu=False, train_batch_size=train_batch_size,
        eval_batch_size=eval_batch_size, predict_batch_size=predict_batch_size,
        batch_axis=batch_axis, eval_on_tpu=eval_on_tpu, export_to_tpu=export_to_tpu,
        export_to_cpu=export_to_cpu, warm_start_from=warm_start_from,
        **kwargs)  # the program's TPUEstimator off TPU: it exports, as it would have
    with eager.eager_mode():
      self._engine = _build_engine(model_fn, run_config, params, use_tpu, train_batch_size,
                                   eval_batch_size, predict_batch_size, warm_start_from,
                                   exporter)
    # TPUEstimator's own config: its log_step_count_steps is None (its hooks say the step rate).
    self._config = self._engine.config
    loop.say(f"engine: {_engine_name(self._engine)} ({self._engine.describe()}), "
             f"from {choose.program_engine_source()}")

  def _latest_checkpoint_of_subclass(self, member_name, args, kwargs):
    """args, kwargs of an export with checkpoint_path from a subclass's own latest_checkpoint().

    The Estimator exports the checkpoint `self.latest_checkpoint()` names
    (train, evaluate and predict read the model_dir's latest themselves).
    """
    if type(self).latest_checkpoint is _TPUEstimator.latest_checkpoint:
      return args, kwargs
    bound = inspect.signature(getattr(_TPUEstimator, member_name)).bind(self, *args, **kwargs)
    if bound.arguments.get("checkpoint_path") is None:
      bound.arguments["checkpoint_path"] = self.latest_checkpoint()
    return bound.args[1:], bound.kwargs

  def _engine_call(self, member_name, /, *args, **kwargs):
    """The engine's member called in its eager context; the engine itself reads as self."""
    member = getattr(self._engine, member_name, None)
    if member is None:
      raise EngineRefusal(f"TPUEstimator.{member_name} is not on the distribute engine; "
                          f"{_ESTIMATOR_INSTEAD}")
    result = eager.eagerly(member)(*args, **kwargs)
    return self if result is self._engine else result

  def __getattr__(self, name):
    """The engine's own attributes (strategy, describe(), ...), for what TPUEstimator lacks."""
    engine = self.__dict__.get("_engine")
    if engine is None or name.startswith("__"):
      raise AttributeError(name)
    value = getattr(engine, name)
    return eager.eagerly(value) if callable(value) else value


def _engine_member(name, is_property):
  """A public TPUEstimator member that is the engine's."""
  if is_property:
    return property(lambda self: _engine_value(self, name))

  def member(self, *args, **kwargs):
    if name in _EXPORTS:
      args, kwargs = self._latest_checkpoint_of_subclass(name, args, kwargs)
    return self._engine_call(name, *args, **kwargs)

  member.__name__ = name
  member.__doc__ = getattr(_TPUEstimator, name).__doc__
  return member


def _engine_value(estimator, name):
  if not hasattr(estimator._engine, name):  # pylint: disable=protected-access
    raise EngineRefusal(f"TPUEstimator.{name} is not on the distribute engine; "
                        f"{_ESTIMATOR_INSTEAD}")
  return getattr(estimator._engine, name)  # pylint: disable=protected-access


def _public_members():
  """{name: is_property} of TPUEstimator's public members."""
  return {name: isinstance(inspect.getattr_static(_TPUEstimator, name), property)
          for name in dir(_TPUEstimator) if not name.startswith("_")}


for _name, _is_property in _public_members().items():
  if _name not in _TENSORFLOWS_OWN and _name not in EngineTPUEstimator.__dict__:
    setattr(EngineTPUEstimator, _name, _engine_member(_name, _is_property))


def _program_class(cls):
  """The class the program constructed: TPUEstimator, or its subclass routed_class() was given."""
  return cls.__dict__.get("_routed_from", _TPUEstimator)


def _check_arguments(model_fn, config, params, use_tpu, train_batch_size):
  """TPUEstimator's checks of its arguments, with its messages."""
  if config is None or not isinstance(config, tpu_config.RunConfig):
    raise ValueError("`config` must be provided with type `tpu_config.RunConfig`")
  reserved = tpu_estimator._RESERVED_PARAMS_KEYS  # pylint: disable=protected-access
  if params is not None and any(key in params for key in reserved):
    raise ValueError(f"{reserved} are reserved keys but existed in params {params}.")
  if use_tpu and train_batch_size is None:
    raise ValueError("`train_batch_size` cannot be `None`")
  if model_fn is None:
    raise ValueError("model_fn must be provided to Estimator.")
  # The model_fn's arguments are checked (and warned about) by TensorFlow's own TPUEstimator,
  # which the engine builds to export with (engines/distribute/surface.py).


def _refuse_what_the_engine_lacks(config, use_tpu, batch_axis, embedding_config_spec,
                                  warm_start_from):
  """One line for each TPUEstimator argument the engine would otherwise leave unused."""
  tpu = config.tpu_config
  # (TPUConfig's input_partition_dims, spatial partitioning, needs num_cores_per_replica.)
  fields = {"TPUConfig(num_cores_per_replica=...) (model parallelism)":
                use_tpu and tpu.num_cores_per_replica,
            "TPUEstimator(embedding_config_spec=...) (TPU embeddings)": embedding_config_spec,
            "TPUEstimator(batch_axis=...) (each replica's batch is its own input_fn batch "
            "here)": use_tpu and batch_axis is not None}
  for field, given in fields.items():
    if given:
      raise EngineRefusal(f"{field} is not on the distribute engine; {_ESTIMATOR_INSTEAD}")
  settings = warm_start_from
  if settings is not None and not isinstance(settings, (str, bytes)) and (
      settings.vars_to_warm_start != ".*" or settings.var_name_to_vocab_info
      or settings.var_name_to_prev_var_name):
    raise EngineRefusal(
        "WarmStartSettings with vars_to_warm_start, var_name_to_vocab_info or "
        "var_name_to_prev_var_name is not on the distribute engine (it warm-starts every "
        f"trainable variable by name from ckpt_to_initialize_from); {_ESTIMATOR_INSTEAD}")


def _warm_start_path(warm_start_from):
  if warm_start_from is None or isinstance(warm_start_from, (str, bytes)):
    return warm_start_from
  return warm_start_from.ckpt_to_initialize_from  # WarmStartSettings


def _engine_name(engine):
  return getattr(engine, "engine_name", "distribute")


def _build_engine(model_fn, run_config, params, use_tpu, train_batch_size, eval_batch_size,
                  predict_batch_size, warm_start_from, exporter):
  if choose.program_engine(use_tpu) == "jax":
    engine_class = choose.jax_engine_class()
    placement = {"devices": choose.program_jax_devices(use_tpu)}
  else:
    engine_class = distribute_engine.DistributeEngine
    placement = {"strategy": choose.program_strategy(use_tpu, run_config)}
  return engine_class(
      model_fn, params or {}, model_dir=run_config.model_dir,
      train_batch_size=train_batch_size, eval_batch_size=eval_batch_size or train_batch_size,
      predict_batch_size=predict_batch_size or eval_batch_size or train_batch_size,
      use_tpu=use_tpu, **placement,
      iterations_per_loop=int(run_config.tpu_config.iterations_per_loop),
      save_checkpoints_steps=run_config.save_checkpoints_steps or distribute_engine.SAVE_AT_END,
      seed=run_config.tf_random_seed, warm_start_from=_warm_start_path(warm_start_from),
      export_estimator_fn=exporter, run_config=run_config,
      keep_checkpoint_max=run_config.keep_checkpoint_max,
      save_checkpoints_secs=run_config.save_checkpoints_secs)


def routed_class(cls):
  """cls with the engine beneath it: cls's own members first, then EngineTPUEstimator's.

  Named as cls (TPUEstimator itself gets EngineTPUEstimator under its own name).

  Raises:
    EngineRefusal: cls overrides a private member of TPUEstimator or
      Estimator, which the engine never calls.
  """
  if cls not in _ROUTED:
    _refuse_private_overrides(cls)
    bases = (EngineTPUEstimator,) if cls is _TPUEstimator else (cls, EngineTPUEstimator)
    module = EngineTPUEstimator.__module__ if cls is _TPUEstimator else cls.__module__
    _ROUTED[cls] = type(cls.__name__, bases,
                        {"__module__": module, "__qualname__": cls.__qualname__,
                         "__doc__": cls.__doc__, "_routed_from": cls})
  return _ROUTED[cls]


_ROUTED = {}


def _refuse_private_overrides(cls):
  tensorflows = set(_TPUEstimator.__mro__)
  for klass in cls.__mro__:
    if klass in tensorflows:
      break
    for name in klass.__dict__:
      if (name.startswith("_") and not name.startswith("__") and name not in _API_NAMES
          and hasattr(_TPUEstimator, name)):
        raise EngineRefusal(
            f"{klass.__name__} overrides TPUEstimator.{name}, which the distribute engine never "
            f"calls (it runs the model_fn in tf.functions under a tf.distribute strategy); "
            f"{_ESTIMATOR_INSTEAD}")


def routing_construct(cls, **kwargs):
  """TensorFlow's TPUEstimator class constructed as itself, whatever the engine chosen."""
  estimator = object.__new__(cls)
  from estimator_tpu.compat import routing  # pylint: disable=import-outside-toplevel
  routing.tensorflows_init(estimator, **kwargs)
  return estimator


def engine_of(estimator):
  """The DistributeEngine an EngineTPUEstimator runs on (tests, preflight)."""
  return estimator._engine  # pylint: disable=protected-access

