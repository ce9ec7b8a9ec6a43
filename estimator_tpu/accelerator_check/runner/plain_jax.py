"""The project's networks and training step in plain JAX: what the lowered step is timed against.

Written from the networks' description (estimator_tpu/model/networks.py,
model_fn.py, optimization.py), with jax.lax and jax.numpy only, and no code
of the lowered step: ResNet v1.5 (basic blocks for 18/34, bottlenecks for
50; the stride on the 3x3 convolution; a 1x1 projection where the shape
changes), the flowers CNN and the tiny network; each conv without bias, then
batch norm over the batch (moving statistics updated as Keras does), ReLU;
global average pool, dense logits. The step: softmax cross-entropy (mean
over the batch) plus weight decay (half the sum of squares of every kernel,
times the decay), gradients by `jax.value_and_grad`, TF 1's Nesterov
momentum update (`accum = m * accum + g; w -= lr * (g + m * accum)`), the
step counter plus one. In bfloat16, convolutions and the dense layer compute
in bfloat16 from float32 weights, batch norm in float32 (Keras'
`mixed_bfloat16`); logits and the loss are float32.

`layout(network, image_shape)` lists the variables in the order the network
creates them (each conv's kernel, then its batch norm's gamma, beta, moving
mean, moving variance; the head's kernel and bias): the role and shape of
each, as the bundle's manifest lists the lowered step's.
"""

import math

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
from regenerate import BETA
from regenerate import BIAS
from regenerate import GAMMA
from regenerate import KERNEL
from regenerate import MOVING_MEAN
from regenerate import MOVING_VARIANCE

TRAINABLE = (KERNEL, GAMMA, BETA, BIAS)
STATISTICS = (MOVING_MEAN, MOVING_VARIANCE)
RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3)}


class _Layout:
  """Records each variable's (role, shape) as the network asks for it; gives zeros."""

  def __init__(self):
    self.entries = []

  def variable(self, role, shape):
    self.entries.append((role, tuple(shape)))
    return jnp.zeros(shape, jnp.float32)

  def batch_norm(self, x, gamma, beta, mean, variance):
    del gamma, beta, mean, variance
    return x


class _Apply:
  """Gives the network its variables in order; batch norm over the batch; new statistics."""

  def __init__(self, values, bn_momentum, bn_epsilon):
    self._values = iter(values)
    self._momentum = bn_momentum
    self._epsilon = bn_epsilon
    self.statistics = []

  def variable(self, role, shape):
    del role, shape
    return next(self._values)

  def batch_norm(self, x, gamma, beta, mean, variance):
    x32 = x.astype(jnp.float32)
    batch_mean = jnp.mean(x32, axis=(0, 1, 2))
    batch_variance = jnp.mean(jnp.square(x32 - batch_mean), axis=(0, 1, 2))
    count = x.shape[0] * x.shape[1] * x.shape[2]
    unbiased = batch_variance * (count / max(count - 1, 1))
    m = self._momentum
    self.statistics += [lax.stop_gradient(mean * m + batch_mean * (1 - m)),
                        lax.stop_gradient(variance * m + unbiased * (1 - m))]
    y = (x32 - batch_mean) * lax.rsqrt(batch_variance + self._epsilon) * gamma + beta
    return y.astype(x.dtype)


def _conv_bn(ctx, x, filters, size, strides, relu=True):
  kernel = ctx.variable(KERNEL, (size, size, x.shape[-1], filters))
  y = lax.conv_general_dilated(x, kernel.astype(x.dtype), (strides, strides), "SAME",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  gamma = ctx.variable(GAMMA, (filters,))
  beta = ctx.variable(BETA, (filters,))
  mean = ctx.variable(MOVING_MEAN, (filters,))
  variance = ctx.variable(MOVING_VARIANCE, (filters,))
  y = ctx.batch_norm(y, gamma, beta, mean, variance)
  return jax.nn.relu(y) if relu else y


def _max_pool(x, size, strides, padding):
  # A Python -inf: JAX then knows the window's max and how to differentiate it.
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, strides, strides, 1),
                           padding)


def _head(ctx, x, num_classes):
  pooled = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(x.dtype)
  kernel = ctx.variable(KERNEL, (x.shape[-1], num_classes))
  bias = ctx.variable(BIAS, (num_classes,))
  logits = pooled @ kernel.astype(x.dtype) + bias.astype(x.dtype)
  return logits.astype(jnp.float32)


def _residual_block(ctx, x, filters, strides, bottleneck):
  out_filters = 4 * filters if bottleneck else filters
  shortcut = x
  if strides != 1 or x.shape[-1] != out_filters:
    shortcut = _conv_bn(ctx, x, out_filters, 1, strides, relu=False)
  if bottleneck:
    y = _conv_bn(ctx, x, filters, 1, 1)
    y = _conv_bn(ctx, y, filters, 3, strides)
    y = _conv_bn(ctx, y, out_filters, 1, 1, relu=False)
  else:
    y = _conv_bn(ctx, x, filters, 3, strides)
    y = _conv_bn(ctx, y, filters, 3, 1, relu=False)
  return jax.nn.relu(y + shortcut)


def _resnet(ctx, x, num_classes, depth):
  if depth not in RESNET_BLOCKS:
    raise ValueError(f"resnet depth {depth} is not one of {sorted(RESNET_BLOCKS)}")
  x = _conv_bn(ctx, x, 64, 7, 2)
  x = _max_pool(x, 3, 2, "SAME")
  for stage, num_blocks in enumerate(RESNET_BLOCKS[depth]):
    for block in range(num_blocks):
      strides = 2 if stage > 0 and block == 0 else 1
      x = _residual_block(ctx, x, 64 * 2 ** stage, strides, depth >= 50)
  return _head(ctx, x, num_classes)


def _flowers(ctx, x, num_classes, image_size):
  for block in range(max(1, min(5, int(math.log2(image_size)) - 2))):
    filters = min(256, 32 * 2 ** block)
    x = _conv_bn(ctx, _conv_bn(ctx, x, filters, 3, 1), filters, 3, 1)
    x = _max_pool(x, 2, 2, "VALID")
  return _head(ctx, x, num_classes)


def _tiny(ctx, x, num_classes):
  return _head(ctx, _conv_bn(ctx, x, 8, 3, 2), num_classes)


def forward(ctx, network, images, dtype):
  """Logits [batch, classes] (float32) of network (the manifest's description) for images."""
  x = images.astype(dtype)
  name = network["model"]
  if name == "resnet":
    return _resnet(ctx, x, network["num_classes"], network["resnet_depth"])
  if name == "flowers":
    return _flowers(ctx, x, network["num_classes"], network["image_size"])
  if name == "tiny":
    return _tiny(ctx, x, network["num_classes"])
  raise ValueError(f"no plain JAX network {name!r}: one of resnet, flowers, tiny")


def layout(network, image_shape):
  """[(role, shape)] of the network's variables, in the order it creates them."""
  ctx = _Layout()
  jax.eval_shape(lambda x: forward(ctx, network, x, jnp.float32),
                 jax.ShapeDtypeStruct(tuple(image_shape), jnp.float32))
  return ctx.entries


class PlainStep:
  """The plain JAX training step of a bundle model: `step(state, batch) -> (state, loss)`.

  Args:
    model: the manifest's model entry (network, precision, optimizer, batch).
    values: the network's initial variables in layout() order (NumPy arrays).

  Attributes:
    state: the initial state, (variables, momentum slots, step), as NumPy arrays.
  """

  def __init__(self, model, values):
    self._network = model["network"]
    self._optimizer = model["optimizer"]
    self._dtype = jnp.bfloat16 if model["precision"] == "bfloat16" else jnp.float32
    image_shape = model["batch"][0]["shape"]
    self._roles = [role for role, _ in layout(self._network, image_shape)]
    self._trainable_roles = [r for r in self._roles if r in TRAINABLE]
    if len(values) != len(self._roles):
      raise ValueError(f"{len(values)} initial values for {len(self._roles)} variables")
    slots = [np.zeros_like(v) for v, r in zip(values, self._roles) if r in TRAINABLE]
    self.state = (list(values), slots, np.zeros([], np.int32))

  def _merge(self, trainable, statistics):
    trainable, statistics = iter(trainable), iter(statistics)
    return [next(trainable) if r in TRAINABLE else next(statistics) for r in self._roles]

  def _loss(self, trainable, statistics, images, labels):
    opt = self._optimizer
    ctx = _Apply(self._merge(trainable, statistics), opt["bn_momentum"], opt["bn_epsilon"])
    logits = forward(ctx, self._network, images, self._dtype)
    log_probabilities = jax.nn.log_softmax(logits)
    cross_entropy = -jnp.mean(jnp.take_along_axis(log_probabilities, labels[:, None], 1))
    kernels = [w for w, r in zip(trainable, self._trainable_roles) if r == KERNEL]
    decay = opt["weight_decay"] * sum(0.5 * jnp.sum(jnp.square(w)) for w in kernels)
    return cross_entropy + decay, ctx.statistics

  def step(self, state, batch):
    """One training step: ((variables, slots, step), [images, labels]) -> (new state, loss)."""
    values, slots, step = state
    images, labels = batch
    trainable = [v for v, r in zip(values, self._roles) if r in TRAINABLE]
    statistics = [v for v, r in zip(values, self._roles) if r in STATISTICS]
    (loss, statistics), grads = jax.value_and_grad(self._loss, has_aux=True)(
        trainable, statistics, images, labels)
    lr, m = self._optimizer["learning_rate"], self._optimizer["momentum"]
    slots = [m * s + g for s, g in zip(slots, grads)]
    if self._optimizer["nesterov"]:
      trainable = [w - lr * (g + m * s) for w, g, s in zip(trainable, grads, slots)]
    else:
      trainable = [w - lr * s for w, s in zip(trainable, slots)]
    return (self._merge(trainable, statistics), slots, step + 1), loss
