"""Learning-rate schedule, optimizer, and the CrossShardOptimizer guard."""

import math

import tensorflow as tf

REFERENCE_BATCH = 256
STEP_DECAY_BOUNDARIES = (0.3, 0.6, 0.8)
STEP_DECAY_RATE = 0.1


def learning_rate(global_step, params):
  """base_learning_rate x global batch / 256, linear warm-up, then decay.

  Args:
    global_step: int64 scalar tensor.
    params: dict with `base_learning_rate`, `train_batch_size`, `train_steps`,
      `warmup_steps` and `lr_schedule` ('cosine', 'step' or 'constant').

  Returns:
    float32 scalar tensor.
  """
  peak = params["base_learning_rate"] * params["train_batch_size"] / REFERENCE_BATCH
  step = tf.cast(global_step, tf.float32)
  total = float(params["train_steps"])
  warmup = float(params["warmup_steps"])
  schedule = params["lr_schedule"]
  if schedule == "cosine":
    progress = tf.clip_by_value((step - warmup) / max(1.0, total - warmup), 0.0, 1.0)
    decayed = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
  elif schedule == "step":
    boundaries = [int(total * b) for b in STEP_DECAY_BOUNDARIES]
    values = [peak * STEP_DECAY_RATE ** i for i in range(len(boundaries) + 1)]
    decayed = tf.compat.v1.train.piecewise_constant(
        tf.cast(global_step, tf.int64), boundaries, values)
    if callable(decayed):  # eager mode returns the schedule, not its value
      decayed = decayed()
  elif schedule == "constant":
    decayed = tf.constant(peak, tf.float32)
  else:
    raise ValueError(f"unknown lr_schedule {schedule!r}")
  if warmup > 0:
    decayed = tf.where(step < warmup, peak * step / warmup, decayed)
  return tf.cast(decayed, tf.float32)


def make_optimizer(lr, params):
  """The v1 optimizer named by params['optimizer'], wrapped for TPU when on TPU.

  CrossShardOptimizer sums gradients over TPU cores with CrossReplicaSum, an op
  with no CPU or GPU kernel: wrapping off TPU fails at run time, so wrap only
  when params['use_tpu'] (set by TPUEstimator itself).
  """
  name = params["optimizer"]
  if name == "momentum":
    optimizer = tf.compat.v1.train.MomentumOptimizer(
        lr, momentum=params["momentum"], use_nesterov=True)
  elif name == "adam":
    optimizer = tf.compat.v1.train.AdamOptimizer(lr)
  else:
    raise ValueError(f"unknown optimizer {name!r}; use momentum or adam")
  if params.get("use_tpu"):
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return optimizer


def weight_decay_loss(variables, weight_decay):
  """L2 penalty over weights, skipping batch-norm parameters and biases."""
  penalized = [tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in variables
               if "batch_normalization" not in v.name and "bias" not in v.name]
  if not penalized or not weight_decay:
    return tf.constant(0.0)
  return weight_decay * tf.add_n(penalized)
