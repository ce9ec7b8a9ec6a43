"""Model helpers, 2019 TPU image-model style: cross-replica batch norm, EMA, learning rate."""

from estimator_tpu.compat import tf
from tensorflow.contrib.tpu.python.tpu import tpu_function


def cross_replica_mean(t, num_shards_per_group=None):
  """Calculates the average value of input tensor across TPU replicas."""
  num_shards = tpu_function.get_tpu_context().number_of_shards
  if not num_shards_per_group:
    return tf.contrib.tpu.cross_replica_sum(t) / tf.cast(num_shards, t.dtype)
  raise ValueError("num_shards_per_group=%s is not supported here" % num_shards_per_group)


class TpuBatchNormalization(tf.layers.BatchNormalization):
  """Cross replica batch normalization."""

  def __init__(self, fused=False, **kwargs):
    if fused in (True, None):
      raise ValueError("TpuBatchNormalization does not support fused=True.")
    super(TpuBatchNormalization, self).__init__(fused=fused, **kwargs)

  def _moments(self, inputs, reduction_axes, keep_dims):
    """Compute the mean and variance: it overrides the original _moments."""
    shard_mean, shard_variance = super(TpuBatchNormalization, self)._moments(
        inputs, reduction_axes, keep_dims=keep_dims)
    num_shards = tpu_function.get_tpu_context().number_of_shards or 1
    if num_shards > 1:
      # Compute variance using: Var[X] = E[X^2] - E[X]^2.
      shard_square_of_mean = tf.math.square(shard_mean)
      shard_mean_of_square = shard_variance + shard_square_of_mean
      group_mean = cross_replica_mean(shard_mean)
      group_mean_of_square = cross_replica_mean(shard_mean_of_square)
      group_variance = group_mean_of_square - tf.math.square(group_mean)
      return (group_mean, group_variance)
    self.moments_calls = getattr(self, "moments_calls", 0) + 1
    return (shard_mean, shard_variance)


def build_learning_rate(initial_lr, global_step, steps_per_epoch, decay_epochs=2.4,
                        decay_factor=0.97, warmup_epochs=1):
  """Exponential decay with a linear warm-up, as the image models built it."""
  decay_steps = max(int(steps_per_epoch * decay_epochs), 1)
  lr = tf.train.exponential_decay(initial_lr, global_step, decay_steps, decay_factor,
                                  staircase=True)
  warmup_steps = int(warmup_epochs * steps_per_epoch)
  warmup_lr = (initial_lr * tf.cast(global_step, tf.float32) / tf.cast(
      max(warmup_steps, 1), tf.float32))
  return tf.cond(global_step < warmup_steps, lambda: warmup_lr, lambda: lr)


def get_ema_vars():
  """Get all exponential moving average (ema) variables."""
  ema_vars = tf.trainable_variables() + tf.get_collection("moving_vars")
  for v in tf.global_variables():
    # We maintain mva for batch norm moving mean and variance as well.
    if "moving_mean" in v.name or "moving_variance" in v.name:
      ema_vars.append(v)
  return list(set(ema_vars))
