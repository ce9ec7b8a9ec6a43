"""A MnasNet-style TPU model in its released tf.compat.v1 form (2019-10), on the 8x8 digits.

  python mnasnet_main.py --model_dir=MODEL --train_steps=10 --export_dir=EXPORT

`import tensorflow.compat.v1 as tf`, `from tensorflow.python.tpu import
tpu_function`, `tf.estimator.tpu.*`, `tf.tpu.bfloat16_scope()`, a batch norm
subclass that overrides `_moments` with the TF 1 signature, a moving average
of the weights that evaluation restores. Writes MODEL/eval_results.txt.
"""

import os

from absl import app
from absl import flags
import numpy as np
from sklearn import datasets
from estimator_tpu.compat import tf

from tensorflow.python.tpu import tpu_function  # pylint: disable=g-direct-tensorflow-import

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Estimator model_dir.")
flags.DEFINE_string("export_dir", None, "Where the SavedModel goes (optional).")
flags.DEFINE_integer("train_steps", 10, "Training steps.")
flags.DEFINE_integer("batch_size", 32, "Global batch size for training and eval.")
flags.DEFINE_float("moving_average_decay", 0.99, "Decay of the weights' moving average.")


class BatchNormalization(tf.layers.BatchNormalization):
  """Batch norm whose statistics are averaged over the shards of a TPU replica group."""

  def _moments(self, inputs, reduction_axes, keep_dims):
    mean, variance = super(BatchNormalization, self)._moments(
        inputs, reduction_axes, keep_dims=keep_dims)
    shards = tpu_function.get_tpu_context().number_of_shards or 1
    if shards > 1:
      mean_of_square = variance + tf.square(mean)
      mean = tf.tpu.cross_replica_sum(mean) / shards
      variance = tf.tpu.cross_replica_sum(mean_of_square) / shards - tf.square(mean)
    return mean, variance


def mnas_block(x, filters, training, name):
  with tf.variable_scope(name):
    x = tf.keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = tf.nn.relu6(BatchNormalization(name="dw_bn")(x, training=training))
    x = tf.layers.conv2d(x, filters, 1, use_bias=False)
    return BatchNormalization(name="project_bn")(x, training=training)


def model_fn(features, labels, mode, params):
  del params
  training = mode == tf.estimator.ModeKeys.TRAIN
  with tf.tpu.bfloat16_scope():
    x = tf.cast(features, tf.bfloat16)
    x = tf.layers.conv2d(x, 8, 3, padding="same", use_bias=False, name="stem")
    x = mnas_block(tf.nn.relu6(BatchNormalization(name="stem_bn")(x, training=training)),
                   16, training, "block_0")
    logits = tf.cast(tf.layers.dense(tf.reduce_mean(x, [1, 2]), 10, name="logits"), tf.float32)
  ema = tf.train.ExponentialMovingAverage(FLAGS.moving_average_decay,
                                          num_updates=tf.train.get_or_create_global_step())
  restore = lambda: tf.train.Scaffold(saver=tf.train.Saver(ema.variables_to_restore()))  # noqa
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={"probabilities": tf.nn.softmax(logits)}, scaffold_fn=restore)
  loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
  if training:
    optimizer = tf.train.RMSPropOptimizer(0.01, decay=0.9, momentum=0.9, epsilon=1e-3)
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(loss, tf.train.get_global_step())
    with tf.control_dependencies([train_op]):
      train_op = ema.apply(tf.trainable_variables())
    return tf.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
  metric_fn = lambda labels, logits: {  # noqa
      "top_1_accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}
  return tf.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=restore,
                                           eval_metrics=(metric_fn, [labels, logits]))


def input_fn(params, training):
  data = datasets.load_digits()
  images = np.repeat((data.images / 16.0).astype(np.float32)[..., None], 3, axis=-1)
  labels = data.target.astype(np.int32)
  split = slice(0, 1500) if training else slice(1500, None)
  dataset = tf.data.Dataset.from_tensor_slices((images[split], labels[split])).repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def main(unused_argv):
  config = tf.estimator.tpu.RunConfig(
      model_dir=FLAGS.model_dir,
      tpu_config=tf.estimator.tpu.TPUConfig(iterations_per_loop=5, num_shards=8))
  estimator = tf.estimator.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=FLAGS.batch_size,
      eval_batch_size=FLAGS.batch_size, export_to_tpu=False)
  estimator.train(lambda params: input_fn(params, True), max_steps=FLAGS.train_steps)
  results = estimator.evaluate(lambda params: input_fn(params, False), steps=4)
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "eval_results.txt"), "w") as writer:
    for key in sorted(results):
      writer.write("%s = %s\n" % (key, results[key]))
  if FLAGS.export_dir:
    estimator.export_saved_model(FLAGS.export_dir, lambda: tf.estimator.export.
                                 TensorServingInputReceiver(*[tf.placeholder(
                                     tf.float32, [None, 8, 8, 3])] * 2))


if __name__ == "__main__":
  app.run(main)
