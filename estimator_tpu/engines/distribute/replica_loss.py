"""One evaluation step's loss over several replicas: each replica's loss weighted by its examples.

A step takes one global batch, each replica its share. When the shares are
equal, the mean of the replicas' losses is the loss of the global batch;
when the last batch is partial, tf.distribute gives the replicas unequal
shares (some none at all, whose loss is NaN), and only the mean weighted by
each replica's examples is the loss one device reports for that batch (for
a loss that is a mean over its examples, as TF 1 losses are).
"""

import tensorflow as tf


def weighted(loss, features, labels):
  """In a replica: (its loss x its examples, its examples), float32 scalars.

  Its examples are the labels' first dimension, else the first features
  tensor's (transposed images, HWCN, come with labels). A replica without
  examples gives (0, 0), not its NaN loss.
  """
  examples = tf.constant(1.0)
  for tensor in tf.nest.flatten(labels) + tf.nest.flatten(features):
    if isinstance(tensor, tf.Tensor) and tensor.shape.rank:
      examples = tf.cast(tf.shape(tensor)[0], tf.float32)
      break
  loss = tf.cast(loss, tf.float32)
  return tf.where(examples > 0, loss * examples, 0.0), examples


def combined(strategy, weighted_losses, examples):
  """In cross-replica context: the replicas' weighted() as the loss of all their examples."""
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, examples, axis=None)
  summed = strategy.reduce(tf.distribute.ReduceOp.SUM, weighted_losses, axis=None)
  return summed / tf.maximum(total, 1.0)
