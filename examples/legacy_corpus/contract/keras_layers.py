"""Keras layers, a TPU-aware batch norm subclass and Keras models inside a TF 1 model_fn.

  python keras_layers.py --model_dir=MODEL --results=RESULTS.json [--evaluate_only]

As 2020 detection backbones are written: blocks are `tf.keras.layers.Layer`s
holding `tf.keras.layers.Conv2D`s and a `BatchNormalization` subclass that
overrides `_moments` for cross-replica statistics on TPU and puts its
`updates` in UPDATE_OPS; a subclassed `tf.keras.Model` of those blocks is
called twice on two views (one set of weights) under
`tf.variable_scope('backbone', reuse=tf.AUTO_REUSE)`; a functional
`tf.keras.Model` (from `tf.keras.Input`) is built in the same scope entered
again; a `tf.layers.dense` head. A TPUEstimator (use_tpu=False) trains 4
steps with momentum and evaluates; the results hold the checkpoint's variable
names and evaluate()'s dict. With --evaluate_only it evaluates model_dir's
checkpoint as it is (another engine's, for the tests).
"""

import json

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write what was seen (JSON).")
flags.DEFINE_bool("evaluate_only", False, "Evaluate model_dir's checkpoint without training.")

BATCH = 8


class TpuBatchNormalization(tf.keras.layers.BatchNormalization):
  """Cross-replica batch norm as TPU programs write it: the shard's moments off TPU."""

  def __init__(self, fused=False, **kwargs):
    if fused in (True, None):
      raise ValueError("TpuBatchNormalization does not support fused=True.")
    super().__init__(fused=fused, **kwargs)

  def _moments(self, inputs, reduction_axes, keep_dims):
    # On a TPU the shards' moments are averaged here (tf.tpu.cross_replica_sum); off TPU
    # the batch is one shard.
    return super()._moments(inputs, reduction_axes, keep_dims=keep_dims)

  def call(self, inputs, training=None):
    outputs = super().call(inputs, training)
    for update in self.updates:  # the TF 1 habit: batch norm updates through UPDATE_OPS
      tf.add_to_collection(tf.GraphKeys.UPDATE_OPS, update)
    return outputs


class Block(tf.keras.layers.Layer):
  def __init__(self, filters, **kwargs):
    super().__init__(**kwargs)
    self.conv = tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)
    self.norm = TpuBatchNormalization(momentum=0.9)

  def call(self, inputs, training=None):
    return tf.nn.relu(self.norm(self.conv(inputs), training=training))


class Backbone(tf.keras.Model):
  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.blocks = [Block(4), Block(8)]
    self.pool = tf.keras.layers.GlobalAveragePooling2D()

  def call(self, inputs, training=None):
    for block in self.blocks:
      inputs = block(inputs, training=training)
    return self.pool(inputs)


def functional_branch():
  inputs = tf.keras.Input(shape=(8, 8, 3))
  x = tf.keras.layers.Conv2D(2, 3, activation="relu")(inputs)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(tf.keras.layers.Flatten()(x)))


def input_fn(params, training=True):
  rng = np.random.RandomState(1 if training else 2)
  x = rng.normal(size=(48 if training else 24, 8, 8, 3)).astype(np.float32)
  labels = (x[:, :, :, 0].mean(axis=(1, 2)) > 0).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices((x, labels))
  if training:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
  del params
  training = mode == tf.estimator.ModeKeys.TRAIN
  with tf.variable_scope("backbone", reuse=tf.AUTO_REUSE):
    backbone = Backbone()
    views = [backbone(features, training=training),
             backbone(tf.image.flip_left_right(features), training=training)]
  with tf.variable_scope("backbone", reuse=tf.AUTO_REUSE):
    side = functional_branch()(features, training=training)
  logits = tf.layers.dense(tf.concat(views + [side], axis=1), 2, name="head")
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    metric_fn = lambda labels, logits: {  # noqa: E731
        "accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                           eval_metrics=(metric_fn, [labels, logits]))
  optimizer = tf.train.MomentumOptimizer(0.05, momentum=0.9)
  with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
  del argv
  config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, tf_random_seed=1)
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH)
  if not FLAGS.evaluate_only:
    estimator.train(input_fn, max_steps=4)
  results = estimator.evaluate(lambda params: input_fn(params, training=False))
  moving = [name for name in estimator.get_variable_names() if name.endswith("moving_mean")]
  seen = {"names": sorted(estimator.get_variable_names()),
          "evaluate": {k: float(v) for k, v in sorted(results.items())},
          "moving_mean": [float(np.sum(estimator.get_variable_value(n))) for n in moving]}
  with open(FLAGS.results, "w") as f:
    json.dump(seen, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
