"""A small ResNet (v1, basic blocks) in tf.layers, as TF 1 reference models built them."""

from estimator_tpu.compat import tf

BATCH_NORM_DECAY = 0.9
BATCH_NORM_EPSILON = 1e-5


def batch_norm_relu(inputs, is_training, relu=True, init_zero=False, data_format="channels_last"):
  gamma_initializer = tf.zeros_initializer() if init_zero else tf.ones_initializer()
  axis = 1 if data_format == "channels_first" else 3
  inputs = tf.layers.batch_normalization(
      inputs=inputs, axis=axis, momentum=BATCH_NORM_DECAY, epsilon=BATCH_NORM_EPSILON,
      center=True, scale=True, training=is_training, fused=True,
      gamma_initializer=gamma_initializer)
  return tf.nn.relu(inputs) if relu else inputs


def conv2d_fixed_padding(inputs, filters, kernel_size, strides, data_format="channels_last"):
  return tf.layers.conv2d(
      inputs=inputs, filters=filters, kernel_size=kernel_size, strides=strides,
      padding="SAME", use_bias=False,
      kernel_initializer=tf.variance_scaling_initializer(), data_format=data_format)


def residual_block(inputs, filters, is_training, strides, use_projection=False,
                   data_format="channels_last"):
  shortcut = inputs
  if use_projection:
    shortcut = conv2d_fixed_padding(inputs, filters, 1, strides, data_format)
    shortcut = batch_norm_relu(shortcut, is_training, relu=False, data_format=data_format)
  inputs = conv2d_fixed_padding(inputs, filters, 3, strides, data_format)
  inputs = batch_norm_relu(inputs, is_training, data_format=data_format)
  inputs = conv2d_fixed_padding(inputs, filters, 3, 1, data_format)
  inputs = batch_norm_relu(inputs, is_training, relu=False, init_zero=True,
                           data_format=data_format)
  return tf.nn.relu(inputs + shortcut)


def resnet_v1_generator(num_classes, filters=(8, 16), data_format="channels_last"):
  """model(inputs, is_training) -> logits [batch, num_classes]."""

  def model(inputs, is_training):
    inputs = conv2d_fixed_padding(inputs, filters[0], 3, 1, data_format)
    inputs = tf.identity(inputs, "initial_conv")
    inputs = batch_norm_relu(inputs, is_training, data_format=data_format)
    for index, width in enumerate(filters):
      with tf.variable_scope("block_group%d" % (index + 1)):
        inputs = residual_block(inputs, width, is_training, strides=1 if index == 0 else 2,
                                use_projection=index > 0, data_format=data_format)
    axes = [2, 3] if data_format == "channels_first" else [1, 2]
    inputs = tf.reduce_mean(inputs, axes, keepdims=False)
    inputs = tf.identity(inputs, "final_avg_pool")
    inputs = tf.layers.dense(inputs=inputs, units=num_classes,
                             kernel_initializer=tf.random_normal_initializer(stddev=.01))
    return tf.identity(inputs, "final_dense")

  return model
