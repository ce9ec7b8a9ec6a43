"""tf.contrib.layers functions TPU models used that have no TF 2 twin.

layer_norm keeps TF 1's variable names ("LayerNorm/beta", "LayerNorm/gamma")
and epsilon, so BERT-era checkpoints restore into it; the initializers and
regularizers keep TF 1's formulas (which differ from tf.keras' in constants).
"""

import math
import numbers

import tensorflow as tf

from estimator_tpu import tf_logger

v1 = tf.compat.v1


def layer_norm(inputs, center=True, scale=True, activation_fn=None,
               reuse=None, variables_collections=None,
               outputs_collections=None, trainable=True, begin_norm_axis=1,
               begin_params_axis=-1, scope=None):
  """Layer normalization over axes [begin_norm_axis, rank) (graph mode).

  Args:
    inputs: tensor of known rank, e.g. [batch, length, hidden].
    center: add a learned offset `beta`.
    scale: multiply by a learned `gamma`.
    activation_fn: optional activation applied last.
    reuse: variable-scope reuse.
    variables_collections: extra collections for beta/gamma (list, or dict
      keyed by 'beta'/'gamma').
    outputs_collections: collections to add the output to.
    trainable: whether beta/gamma are trainable.
    begin_norm_axis: first axis normalized over (negative counts from end).
    begin_params_axis: first axis of the beta/gamma shape.
    scope: variable scope; default "LayerNorm".

  Returns:
    A tensor of `inputs`' shape and dtype.
  """
  with v1.variable_scope(scope, "LayerNorm", [inputs], reuse=reuse):
    inputs = tf.convert_to_tensor(inputs)
    rank = inputs.shape.ndims
    if rank is None:
      raise ValueError(f"Inputs {inputs.name} has undefined rank.")
    if begin_norm_axis < 0:
      begin_norm_axis += rank
    if begin_params_axis >= rank or begin_norm_axis >= rank:
      raise ValueError(f"begin_params_axis ({begin_params_axis}) and "
                       f"begin_norm_axis ({begin_norm_axis}) must be < rank "
                       f"({rank}).")
    params_shape = inputs.shape[begin_params_axis:]
    if not params_shape.is_fully_defined():
      raise ValueError(f"Inputs {inputs.name}: shape {inputs.shape} must be "
                       f"fully defined from axis {begin_params_axis}.")
    dtype = inputs.dtype.base_dtype
    def make(name, init):
      return _model_variable(name, params_shape, dtype, init, variables_collections, trainable)
    beta = make("beta", v1.zeros_initializer()) if center else None
    gamma = make("gamma", v1.ones_initializer()) if scale else None
    mean, variance = tf.nn.moments(
        inputs, list(range(begin_norm_axis, rank)), keepdims=True)
    epsilon = 1e-3 if dtype == tf.float16 else 1e-12
    outputs = tf.nn.batch_normalization(inputs, mean, variance, beta, gamma,
                                        epsilon)
    outputs.set_shape(inputs.shape)
    if activation_fn is not None:
      outputs = activation_fn(outputs)
    for collection in outputs_collections or []:
      v1.add_to_collection(collection, outputs)
    return outputs


def _model_variable(name, shape, dtype, initializer, collections, trainable):
  """A variable also in MODEL_VARIABLES, as contrib's model_variable made."""
  if isinstance(collections, dict):
    collections = collections.get(name)
  collections = list(collections or []) + [
      v1.GraphKeys.GLOBAL_VARIABLES, v1.GraphKeys.MODEL_VARIABLES]
  return v1.get_variable(name, shape=shape, dtype=dtype,
                         initializer=initializer, trainable=trainable,
                         collections=collections)


def variance_scaling_initializer(factor=2.0, mode="FAN_IN", uniform=False,
                                 seed=None, dtype=tf.float32):
  """TF 1's He-style initializer: stddev sqrt(1.3 * factor / n), truncated.

  Args:
    factor: the scale (2.0: He; 1.0 with FAN_AVG: Xavier/Glorot).
    mode: 'FAN_IN', 'FAN_OUT' or 'FAN_AVG' (what n is).
    uniform: uniform in +-sqrt(3 * factor / n) instead of truncated normal.
    seed: random seed.
    dtype: a floating dtype.

  Returns:
    An initializer `fn(shape, dtype=dtype, partition_info=None)`.
  """
  if not tf.as_dtype(dtype).is_floating:
    raise TypeError(f"Cannot create initializer for non-floating type {dtype}.")
  if mode not in ("FAN_IN", "FAN_OUT", "FAN_AVG"):
    raise TypeError(f"Unknown mode {mode}; use FAN_IN, FAN_OUT or FAN_AVG.")

  def _initializer(shape, dtype=dtype, partition_info=None):
    del partition_info  # TF 1 ignored it too: fans come from `shape`.
    n = _fan(shape, mode)
    if uniform:
      limit = math.sqrt(3.0 * factor / n)
      return tf.random.uniform(shape, -limit, limit, dtype, seed=seed)
    stddev = math.sqrt(1.3 * factor / n)
    return tf.random.truncated_normal(shape, 0.0, stddev, dtype, seed=seed)
  return _initializer


def _fan(shape, mode):
  """n for `mode`: receptive field times in/out channels (matmul and conv)."""
  shape = [int(d) for d in shape]
  if shape:
    fan_in = float(shape[-2]) if len(shape) > 1 else float(shape[-1])
    fan_out = float(shape[-1])
  else:
    fan_in = fan_out = 1.0
  receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
  fan_in, fan_out = fan_in * receptive, fan_out * receptive
  return {"FAN_IN": fan_in, "FAN_OUT": fan_out,
          "FAN_AVG": (fan_in + fan_out) / 2.0}[mode]


def xavier_initializer(uniform=True, seed=None, dtype=tf.float32):
  """Glorot/Xavier: variance_scaling_initializer(1.0, 'FAN_AVG', uniform)."""
  return variance_scaling_initializer(1.0, "FAN_AVG", uniform, seed, dtype)


def _regularizer(scale, scope, default_name, penalty):
  if isinstance(scale, numbers.Integral):
    raise ValueError(f"scale cannot be an integer: {scale}; pass a float.")
  if isinstance(scale, numbers.Real):
    if scale < 0.0:
      raise ValueError(f"Setting a scale less than 0 on a regularizer: {scale}.")
    if scale == 0.0:
      tf_logger.info("Scale of 0 disables regularizer.")
      return lambda _: None

  def regularize(weights):
    with tf.name_scope(scope or default_name) as name:
      factor = tf.convert_to_tensor(scale, dtype=weights.dtype.base_dtype)
      return tf.multiply(factor, penalty(weights), name=name)
  return regularize


def l2_regularizer(scale, scope=None):
  """fn(weights) = scale * sum(weights ** 2) / 2 (tf.nn.l2_loss)."""
  return _regularizer(scale, scope, "l2_regularizer", tf.nn.l2_loss)


def l1_regularizer(scale, scope=None):
  """fn(weights) = scale * sum(|weights|)."""
  return _regularizer(scale, scope, "l1_regularizer",
                      lambda w: tf.reduce_sum(tf.abs(w)))
