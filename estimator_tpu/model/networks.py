"""The networks, as tf.keras models: the flowers CNN, ResNet-18/34/50 and a tiny one for tests.

Subclassed models create ops only when called, so inside a model_fn graph
they hold no placeholders and `updates` lists exactly the batch-norm updates
of the call. Widths are multiples of 8 (128 where layers are large), as the
Cloud TPU performance guide advises. Models output float32 logits
[batch, num_classes].
"""

import math

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.model import precision as precision_lib

BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5
RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3)}
layers = stacks.keras.layers


class ConvBN(layers.Layer):
  """Conv2D (no bias) -> BatchNormalization -> optional ReLU."""

  def __init__(self, filters, kernel_size=3, strides=1, relu=True, **kwargs):
    super().__init__(**kwargs)
    self.conv = layers.Conv2D(filters, kernel_size, strides=strides, padding="same",
                              use_bias=False, kernel_initializer="he_normal",
                              dtype=self.dtype_policy)
    self.bn = layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                                        dtype=self.dtype_policy)
    self.relu = relu

  def call(self, x, training=False):
    x = self.bn(self.conv(x), training=training)
    return tf.nn.relu(x) if self.relu else x


class Head(layers.Layer):
  """Global average pool -> dropout -> dense logits, returned as float32."""

  def __init__(self, num_classes, dropout_rate=0.0, **kwargs):
    super().__init__(**kwargs)
    self.dropout = layers.Dropout(dropout_rate) if dropout_rate else None
    self.dense = layers.Dense(num_classes, dtype=self.dtype_policy, name="logits")

  def call(self, x, training=False):
    x = tf.reduce_mean(x, axis=[1, 2])
    if self.dropout is not None:
      x = self.dropout(x, training=training)
    # Losses and metrics want float32 whatever the compute dtype was.
    return tf.cast(self.dense(x), tf.float32)


class FlowersCNN(stacks.keras.Model):
  """The Cloud TPU flowers-style CNN: [conv-BN-ReLU x2, max-pool] blocks.

  Blocks halve the resolution down to about 4 pixels (at most 5 blocks);
  widths 32, 64, 128, 256, 256.
  """

  def __init__(self, image_size, num_classes, dropout_rate=0.3, **kwargs):
    super().__init__(name="flowers_cnn", **kwargs)
    num_blocks = max(1, min(5, int(math.log2(image_size)) - 2))
    self.convs = []
    for block in range(num_blocks):
      filters = min(256, 32 * 2 ** block)
      self.convs.append((ConvBN(filters, dtype=self.dtype_policy),
                         ConvBN(filters, dtype=self.dtype_policy)))
    self.head = Head(num_classes, dropout_rate, dtype=self.dtype_policy)

  def call(self, x, training=False):
    for first, second in self.convs:
      x = second(first(x, training), training)
      x = tf.nn.max_pool2d(x, 2, 2, "VALID")
    return self.head(x, training)


class ResidualBlock(layers.Layer):
  """A basic (two 3x3) or bottleneck (1x1, 3x3, 1x1 with 4x output) block, ResNet v1.5."""

  def __init__(self, filters, strides, bottleneck, in_filters, **kwargs):
    super().__init__(**kwargs)
    out_filters = 4 * filters if bottleneck else filters
    policy = self.dtype_policy
    self.shortcut = None
    if strides != 1 or in_filters != out_filters:
      self.shortcut = ConvBN(out_filters, 1, strides, relu=False, dtype=policy)
    if bottleneck:
      # v1.5: the stride sits on the 3x3 convolution.
      self.convs = [ConvBN(filters, 1, 1, dtype=policy),
                    ConvBN(filters, 3, strides, dtype=policy),
                    ConvBN(out_filters, 1, 1, relu=False, dtype=policy)]
    else:
      self.convs = [ConvBN(filters, 3, strides, dtype=policy),
                    ConvBN(filters, 3, 1, relu=False, dtype=policy)]

  def call(self, x, training=False):
    shortcut = x if self.shortcut is None else self.shortcut(x, training)
    for conv in self.convs:
      x = conv(x, training)
    return tf.nn.relu(x + shortcut)


class ResNet(stacks.keras.Model):
  """ResNet v1.5 of depth 18, 34 or 50 (bottleneck blocks for 50)."""

  def __init__(self, num_classes, depth=50, dropout_rate=0.0, **kwargs):
    super().__init__(name=f"resnet{depth}", **kwargs)
    if depth not in RESNET_BLOCKS:
      raise ValueError(f"resnet depth={depth} is not one of {sorted(RESNET_BLOCKS)}")
    bottleneck = depth >= 50
    policy = self.dtype_policy
    self.stem = ConvBN(64, 7, 2, dtype=policy)
    self.blocks = []
    in_filters = 64
    for stage, num_blocks in enumerate(RESNET_BLOCKS[depth]):
      filters = 64 * 2 ** stage
      for block in range(num_blocks):
        strides = 2 if stage > 0 and block == 0 else 1
        self.blocks.append(ResidualBlock(filters, strides, bottleneck, in_filters,
                                         dtype=policy))
        in_filters = 4 * filters if bottleneck else filters
    self.head = Head(num_classes, dropout_rate, dtype=policy)

  def call(self, x, training=False):
    x = self.stem(x, training)
    x = tf.nn.max_pool2d(x, 3, 2, "SAME")
    for block in self.blocks:
      x = block(x, training)
    return self.head(x, training)


class Tiny(stacks.keras.Model):
  """One strided conv layer and a classifier: for tests that need a network, not accuracy."""

  def __init__(self, num_classes, dropout_rate=0.0, **kwargs):
    super().__init__(name="tiny", **kwargs)
    self.conv = ConvBN(8, 3, 2, dtype=self.dtype_policy)
    self.head = Head(num_classes, dropout_rate, dtype=self.dtype_policy)

  def call(self, x, training=False):
    return self.head(self.conv(x, training), training)


def build_network(params, precision=None):
  """The network named by params['model'] as an uncalled stacks.keras.Model.

  Its variables are float32; its layers compute in the precision's type
  (the Keras policy float32, mixed_bfloat16 or mixed_float16) and its
  logits are float32.

  Args:
    params: dict with `model`, `image_size`, `num_label_classes`,
      `dropout_rate`, `precision` (or the older `use_bfloat16`) and, for
      ResNet, `resnet_depth`.
    precision: overrides params' precision (one of precision.PRECISIONS).
  """
  policy = precision_lib.keras_policy(precision or precision_lib.of_params(params))
  name = params["model"]
  num_classes = params["num_label_classes"]
  dropout = params["dropout_rate"]
  if name == "flowers":
    return FlowersCNN(params["image_size"], num_classes, dropout, dtype=policy)
  if name == "resnet":
    return ResNet(num_classes, params["resnet_depth"], dropout, dtype=policy)
  if name == "tiny":
    return Tiny(num_classes, dropout, dtype=policy)
  raise ValueError(f"unknown model {name!r}; use flowers, resnet or tiny")
