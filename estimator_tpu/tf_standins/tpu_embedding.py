"""Stand-in for `tensorflow.python.tpu.tpu_embedding` (TF 1 TPU embeddings), which TF 2.16 removed.

The configuration half is here, as TF 2.15 has it: `TableConfig`, `FeatureConfig`,
`EnqueueData`, the optimizer-parameter classes and the slot-name tuples build with
the same arguments, defaults and ValueErrors, so an `EmbeddingConfigSpec` is built
and checked, and a TPUEstimator with one trains on CPU (`use_tpu=False`), on every
stack. What needs the TPU's embedding engine is refused when it is first used:
building `TPUEmbedding` (which TPUEstimator does when `use_tpu=True` meets an
`embedding_config_spec`), or any other name of TF 2.15's module, raises
UnavailableOnThisStack naming what was used and the stack that has it.
"""

import collections
import math
from typing import Optional

from estimator_tpu.tf_standins._refusal import UnavailableOnThisStack

FEATURE = "TPU embeddings (TPUEstimator's embedding_config_spec)"

# TPUEmbeddingConfiguration.Mode's values (tpu_embedding_configuration.proto).
INFERENCE = 1
TRAINING = 2

_COMBINERS = ("mean", "sum", "sqrtn", None)


class TableConfig(collections.namedtuple("TableConfig", [
    "vocabulary_size", "dimension", "initializer", "combiner", "hot_id_replication",
    "learning_rate", "learning_rate_fn", "optimization_parameters"])):
  """One embedding table: its size, initializer, combiner and optional own optimizer."""

  def __new__(cls, vocabulary_size, dimension, initializer=None, combiner="mean",
              hot_id_replication=False, learning_rate=None, learning_rate_fn=None,
              optimization_parameters=None):
    if not isinstance(vocabulary_size, int) or vocabulary_size < 1:
      raise ValueError(f"vocabulary_size must >= 1. Received: {vocabulary_size}.")
    if not isinstance(dimension, int) or dimension < 1:
      raise ValueError(f"dimension must be a positive int. Received: {dimension}.")
    if initializer is not None and not callable(initializer):
      raise ValueError(f"initializer must be callable if specified. Received: {initializer}.")
    if initializer is None:
      from tensorflow.python.ops import init_ops
      initializer = init_ops.truncated_normal_initializer(mean=0.0,
                                                          stddev=1 / math.sqrt(dimension))
    if combiner not in _COMBINERS:
      raise ValueError(f'combiner must be "mean", "sum", "sqrtn" or None. '
                       f"Received: {combiner}.")
    if learning_rate is not None and learning_rate_fn is not None:
      raise ValueError("At most one of learning_rate and learning_rate_fn can be None. "
                       f"Received: {learning_rate} and {learning_rate_fn}")
    if (optimization_parameters is not None
        and not isinstance(optimization_parameters, _OptimizationParameters)):
      raise ValueError("`optimization_parameters` must inherit from `_OptimizationParameters`. "
                       f"Received: `type(optimization_parameters)`="
                       f"{type(optimization_parameters)}.")
    return super().__new__(cls, vocabulary_size, dimension, initializer, combiner,
                           hot_id_replication, learning_rate, learning_rate_fn,
                           optimization_parameters)


class FeatureConfig(collections.namedtuple("FeatureConfig",
                                           ["table_id", "max_sequence_length", "weight_key"])):
  """One input feature: the table it looks up, its sequence length (0: not a sequence)."""

  def __new__(cls, table_id, max_sequence_length=0, weight_key=None):
    if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
      raise ValueError("max_sequence_length must be zero or a positive int, "
                       f"got {max_sequence_length}.")
    return super().__new__(cls, table_id, max_sequence_length, weight_key)


class EnqueueData(collections.namedtuple(
    "EnqueueData", ["embedding_indices", "sample_indices", "aggregation_weights"])):
  """A sparse feature's ids, the examples they belong to and their weights."""

  def __new__(cls, embedding_indices, sample_indices=None, aggregation_weights=None):
    return super().__new__(cls, embedding_indices, sample_indices, aggregation_weights)

  @staticmethod
  def from_sparse_tensor(sp_tensor, weights=None):
    return EnqueueData(sp_tensor.values, sp_tensor.indices,
                       aggregation_weights=None if weights is None else weights.values)


class RaggedEnqueueData(collections.namedtuple(
    "RaggedEnqueueData", ["embedding_indices", "row_splits", "aggregation_weights"])):
  """A ragged feature's ids, row splits and weights."""

  def __new__(cls, embedding_indices, row_splits=None, aggregation_weights=None):
    return super().__new__(cls, embedding_indices, row_splits, aggregation_weights)

  @staticmethod
  def from_ragged_tensor(rg_tensor, weights=None):
    return RaggedEnqueueData(rg_tensor.values, rg_tensor.row_splits,
                             aggregation_weights=None if weights is None else weights.values)


def get_enqueue_datas_list_from_sparse_tensors_list(sp_tensors_list):
  """Per core, {feature: SparseTensor} -> {feature: EnqueueData}."""
  return [collections.OrderedDict((key, EnqueueData.from_sparse_tensor(value))
                                  for key, value in sp_tensors.items())
          for sp_tensors in sp_tensors_list]


def get_enqueue_datas_list_from_ragged_tensors_list(rg_tensors_list):
  """Per core, {feature: RaggedTensor} -> {feature: RaggedEnqueueData}."""
  return [collections.OrderedDict((key, RaggedEnqueueData.from_ragged_tensor(value))
                                  for key, value in rg_tensors.items())
          for rg_tensors in rg_tensors_list]


def _slot_tuples(suffix, fields_by_optimizer):
  return {f"{name}{suffix}": collections.namedtuple(f"{name}{suffix}", fields)
          for name, fields in fields_by_optimizer.items()}


_SLOT_FIELDS = {"Adam": ["m", "v"], "Adagrad": ["accumulator"], "Momentum": ["momenta"],
                "AdagradMomentum": ["accumulator", "momenta"], "RMSProp": ["ms", "mom"],
                "ProximalAdagrad": ["accumulator"], "Ftrl": ["accumulator", "linear"],
                "ProximalYogi": ["v", "m"], "FrequencyEstimator": ["last_hit_step"]}
globals().update(_slot_tuples("SlotVariableNames", _SLOT_FIELDS))
globals().update(_slot_tuples("SlotVariables", {k: v for k, v in _SLOT_FIELDS.items()
                                                if k != "Ftrl"}))
FtrlSlotVariable = collections.namedtuple("FtrlSlotVariable", ["accumulator", "linear"])
VariablesAndOps = collections.namedtuple("VariablesAndOps", [
    "embedding_variables_by_table", "slot_variables_by_table", "load_ops", "retrieve_ops"])
DeviceConfig = collections.namedtuple("DeviceConfig", ["num_hosts", "num_cores", "job_name"])


class _OptimizationParameters:
  """What every TPU-embedding optimizer takes."""

  def __init__(self, learning_rate: float, use_gradient_accumulation: bool,
               clip_weight_min: Optional[float], clip_weight_max: Optional[float],
               weight_decay_factor: Optional[float],
               multiply_weight_decay_factor_by_learning_rate: Optional[bool],
               clip_gradient_min: Optional[float] = None,
               clip_gradient_max: Optional[float] = None):
    self.learning_rate = learning_rate
    self.use_gradient_accumulation = use_gradient_accumulation
    self.clip_weight_min = clip_weight_min
    self.clip_weight_max = clip_weight_max
    self.weight_decay_factor = weight_decay_factor
    self.multiply_weight_decay_factor_by_learning_rate = (
        multiply_weight_decay_factor_by_learning_rate)
    self.clip_gradient_min = clip_gradient_min
    self.clip_gradient_max = clip_gradient_max
    if not use_gradient_accumulation and (clip_gradient_min is not None
                                          or clip_gradient_max is not None):
      raise ValueError("When using gradient clipping limits, gradient  "
                       "accumulation must be enabled.")


def _common(learning_rate, use_gradient_accumulation, clip_weight_min, clip_weight_max,
            weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
            clip_gradient_min, clip_gradient_max):
  return dict(learning_rate=learning_rate, use_gradient_accumulation=use_gradient_accumulation,
              clip_weight_min=clip_weight_min, clip_weight_max=clip_weight_max,
              weight_decay_factor=weight_decay_factor,
              multiply_weight_decay_factor_by_learning_rate=(
                  multiply_weight_decay_factor_by_learning_rate),
              clip_gradient_min=clip_gradient_min, clip_gradient_max=clip_gradient_max)


def _check_regularization(l1, l2):
  for name, value in (("l1_regularization_strength", l1), ("l2_regularization_strength", l2)):
    if value < 0.:
      raise ValueError(f"{name} must be greater than or equal to 0. got {value}.")


def _check_betas(beta1, beta2, epsilon):
  if beta1 < 0. or beta1 >= 1.:
    raise ValueError(f"beta1 must be between 0. and 1; got {beta1}.")
  if beta2 < 0. or beta2 >= 1.:
    raise ValueError(f"beta2 must be between 0. and 1; got {beta2}.")
  if epsilon <= 0.:
    raise ValueError(f"epsilon must be positive; got {epsilon}.")


class AdagradParameters(_OptimizationParameters):
  """Adagrad for TPU embedding tables."""

  def __init__(self, learning_rate: float, initial_accumulator: float = 0.1,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    if initial_accumulator <= 0:
      raise ValueError("Adagrad initial_accumulator must be greater than zero. "
                       f"Received: {initial_accumulator}.")
    self.initial_accumulator = initial_accumulator


class AdagradMomentumParameters(_OptimizationParameters):
  """Adagrad with momentum for TPU embedding tables."""

  def __init__(self, learning_rate: float, momentum: float, use_nesterov: bool = False,
               exponent: float = 2, beta2: float = 1, epsilon: float = 1e-10,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    if epsilon <= 0:
      raise ValueError("Adagrad momentum: epsilon must be positive")
    if exponent <= 0:
      raise ValueError("Adagrad momentum: Precondition exponent must >0")
    self.momentum = momentum
    self.use_nesterov = use_nesterov
    self.exponent = exponent
    self.beta2 = beta2
    self.epsilon = epsilon


class ProximalAdagradParameters(_OptimizationParameters):
  """Proximal Adagrad for TPU embedding tables."""

  def __init__(self, learning_rate: float, initial_accumulator: float = 0.1,
               l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    if initial_accumulator <= 0:
      raise ValueError("Adagrad initial_accumulator must be positive. "
                       f"Received: {initial_accumulator}.")
    _check_regularization(l1_regularization_strength, l2_regularization_strength)
    self.initial_accumulator = initial_accumulator
    self.l1_regularization_strength = l1_regularization_strength
    self.l2_regularization_strength = l2_regularization_strength


class AdamParameters(_OptimizationParameters):
  """Adam (lazy by default) for TPU embedding tables."""

  def __init__(self, learning_rate: float, beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-08, lazy_adam: bool = True, sum_inside_sqrt: bool = True,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    _check_betas(beta1, beta2, epsilon)
    if not use_gradient_accumulation and not lazy_adam:
      raise ValueError("When disabling Lazy Adam, gradient accumulation must be used.")
    self.beta1 = beta1
    self.beta2 = beta2
    self.epsilon = epsilon
    self.lazy_adam = lazy_adam
    self.sum_inside_sqrt = sum_inside_sqrt


class FtrlParameters(_OptimizationParameters):
  """FTRL for TPU embedding tables."""

  def __init__(self, learning_rate: float, learning_rate_power: float = -0.5,
               initial_accumulator_value: float = 0.1,
               l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               multiply_linear_by_learning_rate: bool = False, beta: float = 0,
               allow_zero_accumulator: bool = False, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    if learning_rate_power > 0.:
      raise ValueError("learning_rate_power must be less than or equal to 0. "
                       f"got {learning_rate_power}.")
    if initial_accumulator_value < 0.:
      raise ValueError("initial_accumulator_value must be greater than or equal to 0. "
                       f"got {initial_accumulator_value}.")
    _check_regularization(l1_regularization_strength, l2_regularization_strength)
    self.learning_rate_power = learning_rate_power
    self.initial_accumulator_value = initial_accumulator_value
    self.initial_linear_value = 0.0
    self.l1_regularization_strength = l1_regularization_strength
    self.l2_regularization_strength = l2_regularization_strength
    self.multiply_linear_by_learning_rate = multiply_linear_by_learning_rate
    self.beta = beta
    self.allow_zero_accumulator = allow_zero_accumulator


class ProximalYogiParameters(_OptimizationParameters):
  """Proximal Yogi for TPU embedding tables."""

  def __init__(self, learning_rate: float = 0.01, beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-3, l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               initial_accumulator_value: float = 1e-6,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    _check_betas(beta1, beta2, epsilon)
    _check_regularization(l1_regularization_strength, l2_regularization_strength)
    self.beta1 = beta1
    self.beta2 = beta2
    self.epsilon = epsilon
    self.l1_regularization_strength = l1_regularization_strength
    self.l2_regularization_strength = l2_regularization_strength
    self.initial_accumulator_value = initial_accumulator_value


class MomentumParameters(_OptimizationParameters):
  """Momentum (optionally Nesterov) for TPU embedding tables."""

  def __init__(self, learning_rate: float, momentum: float, use_nesterov: bool = False,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    self.momentum = momentum
    self.use_nesterov = use_nesterov


class RMSPropParameters(_OptimizationParameters):
  """RMSProp for TPU embedding tables."""

  def __init__(self, learning_rate: float, rho: float, momentum: float, epsilon: float,
               use_gradient_accumulation: bool = True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))
    self.rho = rho
    self.momentum = momentum
    self.epsilon = epsilon


class StochasticGradientDescentParameters(_OptimizationParameters):
  """Plain SGD for TPU embedding tables."""

  def __init__(self, learning_rate: float, use_gradient_accumulation: bool = True,
               clip_weight_min=None, clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(learning_rate, use_gradient_accumulation, clip_weight_min,
                               clip_weight_max, weight_decay_factor,
                               multiply_weight_decay_factor_by_learning_rate,
                               clip_gradient_min, clip_gradient_max))


class FrequencyEstimatorParameters(_OptimizationParameters):
  """The frequency estimator (a width-1 table of lookup frequencies)."""

  def __init__(self, tau: float, max_delta: float, outlier_threshold: float,
               weight_exponent: float):
    super().__init__(learning_rate=1.0, use_gradient_accumulation=True,
                     clip_weight_min=None, clip_weight_max=None, weight_decay_factor=None,
                     multiply_weight_decay_factor_by_learning_rate=None)
    self.tau = tau
    self.max_delta = max_delta
    self.outlier_threshold = outlier_threshold
    self.weight_exponent = weight_exponent


class TPUEmbedding:
  """The TPU's embedding engine for a configuration: refused when built (the TPU's use)."""

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise UnavailableOnThisStack(f"{FEATURE}: tpu_embedding.TPUEmbedding")


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  raise UnavailableOnThisStack(f"{FEATURE}: tpu_embedding.{name}")
