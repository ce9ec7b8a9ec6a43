"""Adam with decoupled weight decay as a tf.train.Optimizer subclass, and its schedule."""

import re

from estimator_tpu.compat import tf


def create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps, use_tpu):
  """The train op: linear warm-up, then polynomial decay; clipped global norm 1.0."""
  global_step = tf.train.get_or_create_global_step()
  learning_rate = tf.train.polynomial_decay(
      tf.constant(value=init_lr, shape=[], dtype=tf.float32), global_step, num_train_steps,
      end_learning_rate=0.0, power=1.0, cycle=False)
  if num_warmup_steps:
    steps = tf.cast(global_step, tf.float32)
    warmup_lr = init_lr * steps / float(num_warmup_steps)
    is_warmup = tf.cast(steps < num_warmup_steps, tf.float32)
    learning_rate = (1.0 - is_warmup) * learning_rate + is_warmup * warmup_lr
  optimizer = AdamWeightDecayOptimizer(
      learning_rate=learning_rate, weight_decay_rate=0.01,
      exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])
  if use_tpu:
    optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
  tvars = tf.trainable_variables()
  grads = tf.gradients(loss, tvars)
  grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
  train_op = optimizer.apply_gradients(zip(grads, tvars), global_step=global_step)
  # This optimizer leaves the global step alone; count the step here.
  return tf.group(train_op, [global_step.assign(global_step + 1)])


class AdamWeightDecayOptimizer(tf.train.Optimizer):
  """Adam whose weight decay is added to the update, not to the loss."""

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9, beta_2=0.999,
               epsilon=1e-6, exclude_from_weight_decay=None, name="AdamWeightDecayOptimizer"):
    super(AdamWeightDecayOptimizer, self).__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None or param is None:
        continue
      param_name = self._get_variable_name(param.name)
      m = tf.get_variable(param_name + "/adam_m", shape=param.shape.as_list(),
                          dtype=tf.float32, trainable=False,
                          initializer=tf.zeros_initializer())
      v = tf.get_variable(param_name + "/adam_v", shape=param.shape.as_list(),
                          dtype=tf.float32, trainable=False,
                          initializer=tf.zeros_initializer())
      # tf.multiply turns an embedding's IndexedSlices gradient into a dense one.
      next_m = tf.multiply(self.beta_1, m) + tf.multiply(1.0 - self.beta_1, grad)
      next_v = tf.multiply(self.beta_2, v) + tf.multiply(1.0 - self.beta_2, tf.square(grad))
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      if self._do_use_weight_decay(param_name):
        update += self.weight_decay_rate * param
      assignments.extend([param.assign(param - self.learning_rate * update),
                          m.assign(next_m), v.assign(next_v)])
    return tf.group(*assignments, name=name)

  def _do_use_weight_decay(self, param_name):
    if not self.weight_decay_rate:
      return False
    for pattern in self.exclude_from_weight_decay or []:
      if re.search(pattern, param_name) is not None:
        return False
    return True

  def _get_variable_name(self, param_name):
    match = re.match("^(.*):\\d+$", param_name)
    return match.group(1) if match is not None else param_name
