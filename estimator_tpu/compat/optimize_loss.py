"""tf.contrib.layers.optimize_loss: one call from a loss to a train op (graph mode).

Re-implemented with TF 1.15's semantics: the optimizer may be a name, an
Optimizer class, an instance or a callable(lr); `clip_gradients` as a float
clips the global norm; UPDATE_OPS run before the loss; the summaries are
tf.compat.v1.summary ones; the returned tensor evaluates to the loss after
applying the gradients and incrementing `global_step`.
"""

import tensorflow as tf

v1 = tf.compat.v1

OPTIMIZER_CLS_NAMES = {
    "Adagrad": v1.train.AdagradOptimizer,
    "Adam": v1.train.AdamOptimizer,
    "Ftrl": v1.train.FtrlOptimizer,
    "Momentum": lambda learning_rate: v1.train.MomentumOptimizer(
        learning_rate, momentum=0.9),
    "RMSProp": v1.train.RMSPropOptimizer,
    "SGD": v1.train.GradientDescentOptimizer,
}

OPTIMIZER_SUMMARIES = [
    "learning_rate", "loss", "gradients", "gradient_norm",
    "global_gradient_norm",
]


def optimize_loss(loss, global_step, learning_rate, optimizer,
                  gradient_noise_scale=None, gradient_multipliers=None,
                  clip_gradients=None, learning_rate_decay_fn=None,
                  update_ops=None, variables=None, name=None, summaries=None,
                  colocate_gradients_with_ops=False,
                  increment_global_step=True):
  """Builds the training op for `loss`.

  Args:
    loss: scalar loss tensor.
    global_step: step variable to increment, or None for the graph's own.
    learning_rate: float (held in a non-trainable variable "learning_rate"),
      a scalar tensor, or None when `optimizer` needs none.
    optimizer: a name in OPTIMIZER_CLS_NAMES ('SGD', 'Adam', 'Momentum',
      'Adagrad', 'RMSProp', 'Ftrl'), a tf.compat.v1.train.Optimizer subclass,
      an instance, or a callable(lr) (callable() if learning_rate is None)
      returning an instance.
    gradient_noise_scale: add N(0, scale) truncated noise to gradients.
    gradient_multipliers: {variable or variable name: factor}.
    clip_gradients: float (clip the global norm to it) or a callable taking
      and returning a list of (gradient, variable).
    learning_rate_decay_fn: callable(lr, global_step) -> decayed lr.
    update_ops: ops to run before the loss; default: the UPDATE_OPS collection.
    variables: variables to train; default: all trainable ones.
    name: variable scope name; default "OptimizeLoss".
    summaries: subset of OPTIMIZER_SUMMARIES; default loss, learning_rate
      and global_gradient_norm.
    colocate_gradients_with_ops: passed to compute_gradients.
    increment_global_step: whether applying increments `global_step`.

  Returns:
    A tensor equal to the loss that, when run, applies one update.

  Raises:
    ValueError: a bad learning rate, optimizer, summary name or clip value.
  """
  loss = tf.convert_to_tensor(loss)
  loss.shape.assert_has_rank(0)
  if global_step is None:
    global_step = v1.train.get_global_step()
  else:
    v1.train.assert_global_step(global_step)
  summaries = _check_summaries(summaries)
  with v1.variable_scope(name, "OptimizeLoss", [loss, global_step]):
    loss = _after_update_ops(loss, update_ops)
    lr = _learning_rate(learning_rate, learning_rate_decay_fn, global_step,
                        summaries)
    opt = _make_optimizer(optimizer, lr, learning_rate)
    gradients = _gradients(opt, loss, variables, colocate_gradients_with_ops,
                           gradient_noise_scale, gradient_multipliers)
    gradients = _clip_and_summarize(gradients, loss, clip_gradients, summaries)
    apply_op = opt.apply_gradients(
        gradients, global_step=global_step if increment_global_step else None,
        name="train")
    with tf.control_dependencies([apply_op]):
      return tf.identity(loss)


def _check_summaries(summaries):
  if summaries is None:
    return ["loss", "learning_rate", "global_gradient_norm"]
  for summary in summaries:
    if summary not in OPTIMIZER_SUMMARIES:
      raise ValueError(f"Summaries should be one of "
                       f"[{', '.join(OPTIMIZER_SUMMARIES)}], you provided "
                       f"{summary}.")
  return summaries


def _after_update_ops(loss, update_ops):
  if update_ops is None:
    update_ops = set(v1.get_collection(v1.GraphKeys.UPDATE_OPS))
  if not update_ops:
    return loss
  with tf.control_dependencies(list(update_ops)):
    return tf.identity(loss)


def _learning_rate(learning_rate, decay_fn, global_step, summaries):
  """The learning-rate tensor (or None), decayed if asked."""
  if learning_rate is None:
    return None
  if tf.is_tensor(learning_rate) and learning_rate.shape.ndims == 0:
    lr = learning_rate
  elif isinstance(learning_rate, (float, int)) and not isinstance(
      learning_rate, bool):
    if learning_rate < 0.0:
      raise ValueError(f"Invalid learning_rate {learning_rate}.")
    lr = v1.get_variable(
        "learning_rate", [], trainable=False,
        initializer=v1.constant_initializer(float(learning_rate)))
  else:
    raise ValueError(f"Learning rate should be 0d Tensor or float. Got "
                     f"{learning_rate} of type {type(learning_rate)}")
  if decay_fn is not None:
    if global_step is None:
      raise ValueError("global_step is required for learning_rate_decay_fn.")
    lr = decay_fn(lr, global_step)
    if "learning_rate" in summaries:
      v1.summary.scalar("learning_rate", lr)
  return lr


def _make_optimizer(optimizer, lr, learning_rate):
  """An Optimizer instance from a name, class, instance or callable."""
  if isinstance(optimizer, str):
    if optimizer not in OPTIMIZER_CLS_NAMES:
      raise ValueError(f"Optimizer name should be one of "
                       f"[{', '.join(OPTIMIZER_CLS_NAMES)}], you provided "
                       f"{optimizer}.")
    _require_lr(lr, optimizer)
    return OPTIMIZER_CLS_NAMES[optimizer](learning_rate=lr)
  if isinstance(optimizer, type) and issubclass(optimizer, v1.train.Optimizer):
    _require_lr(lr, optimizer)
    return optimizer(learning_rate=lr)
  if isinstance(optimizer, v1.train.Optimizer):
    return optimizer
  if callable(optimizer):
    opt = optimizer(lr) if learning_rate is not None else optimizer()
    if not isinstance(opt, v1.train.Optimizer):
      raise ValueError(f"Unrecognized optimizer: function should return "
                       f"a tf.compat.v1.train.Optimizer. Got {opt}.")
    return opt
  raise ValueError(f"Unrecognized optimizer: should be string, subclass of "
                   f"Optimizer, instance of subclass of Optimizer or function "
                   f"with one argument. Got {optimizer}.")


def _require_lr(lr, optimizer):
  if lr is None:
    raise ValueError(f"Learning rate is None, but should be specified if "
                     f"optimizer is string or class ({optimizer}).")


def _gradients(opt, loss, variables, colocate, noise_scale, multipliers):
  """compute_gradients, then optional noise and per-variable multipliers."""
  if variables is None:
    variables = v1.trainable_variables()
  gradients = opt.compute_gradients(
      loss, variables, colocate_gradients_with_ops=colocate)
  if noise_scale is not None:
    gradients = [(_add_noise(g, noise_scale), v) for g, v in gradients]
  if multipliers is not None:
    gradients = [(_multiply(g, v, multipliers), v) for g, v in gradients]
    if not gradients:
      raise ValueError("Empty list of (gradient, var) pairs encountered; "
                       "check gradient_multipliers.")
  return gradients


def _add_noise(gradient, scale):
  if gradient is None:
    return None
  if isinstance(gradient, tf.IndexedSlices):
    shape = gradient.dense_shape
  else:
    shape = gradient.shape
  return gradient + tf.random.truncated_normal(shape) * scale


def _multiply(gradient, variable, multipliers):
  """Scales `gradient` by multipliers[variable] (or [variable.name])."""
  # Compared by identity/name: TF 2 variables may refuse to be hashed.
  factors = [factor for key, factor in multipliers.items()
             if key is variable or (isinstance(key, str) and key == variable.name)]
  if gradient is None or not factors:
    return gradient
  factor = factors[0]
  if isinstance(gradient, tf.IndexedSlices):
    values = gradient.values * tf.cast(factor, gradient.dtype)
    return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
  return gradient * tf.cast(factor, gradient.dtype)


def _global_norm(gradients):
  return tf.linalg.global_norm([g for g, _ in gradients])


def _clip_and_summarize(gradients, loss, clip_gradients, summaries):
  """Clips (float: global norm; callable: custom) and writes the summaries."""
  norm_summaries = {"global_gradient_norm", "gradient_norm"} & set(summaries)
  if norm_summaries:
    v1.summary.scalar("global_norm/gradient_norm", _global_norm(gradients))
  if isinstance(clip_gradients, float):
    clipped, _ = tf.clip_by_global_norm([g for g, _ in gradients],
                                        clip_gradients)
    gradients = list(zip(clipped, [v for _, v in gradients]))
  elif callable(clip_gradients):
    gradients = clip_gradients(gradients)
  elif clip_gradients is not None:
    raise ValueError(f"Unknown type {type(clip_gradients)} for clip_gradients; "
                     f"pass a float (global norm) or a callable.")
  if "loss" in summaries:
    v1.summary.scalar("loss", loss)
  _per_variable_summaries(gradients, summaries)
  if clip_gradients is not None and norm_summaries:
    v1.summary.scalar("global_norm/clipped_gradient_norm",
                      _global_norm(gradients))
  return gradients


def _per_variable_summaries(gradients, summaries):
  for gradient, variable in gradients:
    values = gradient.values if isinstance(gradient, tf.IndexedSlices) else (
        gradient)
    if values is None:
      continue
    var_name = variable.name.replace(":", "_")
    if "gradients" in summaries:
      v1.summary.histogram(f"gradients/{var_name}", values)
    if "gradient_norm" in summaries:
      v1.summary.scalar(f"gradient_norm/{var_name}",
                        tf.linalg.global_norm([values]))
