"""Trains, evaluates and exports a small MnasNet/EfficientNet-style model, as 2019 TPU models did.

  python main.py --model_dir=MODEL --train_steps=20 --export_dir=EXPORT

Cross-replica batch norm (a tf.layers.BatchNormalization subclass), a bfloat16
scope, a host_call of tf.contrib.summary scalars and an exponential moving
average of the weights, which evaluation and the export restore.
"""

import os

from absl import app
from absl import flags
import numpy as np
from sklearn import datasets
import utils

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS

flags.DEFINE_bool("use_tpu", False, "Use TPU to execute the model for training and evaluation.")
flags.DEFINE_string("tpu", None, "The Cloud TPU to use for training.")
flags.DEFINE_string("model_dir", None, "The directory where the model and training are stored.")
flags.DEFINE_string("export_dir", None, "The directory where the exported SavedModel is stored.")
flags.DEFINE_integer("train_steps", 20, "The number of steps to use for training.")
flags.DEFINE_integer("train_batch_size", 32, "Batch size for training.")
flags.DEFINE_integer("eval_batch_size", 32, "Batch size for evaluation.")
flags.DEFINE_integer("iterations_per_loop", 5, "Number of steps to run on TPU before outfeeding.")
flags.DEFINE_bool("use_bfloat16", True, "Whether to use bfloat16 as activation for training.")
flags.DEFINE_float("moving_average_decay", 0.9999, "Moving average decay rate.")
flags.DEFINE_float("base_learning_rate", 0.016, "Base learning rate when train batch size is 256.")
flags.DEFINE_bool("skip_host_call", False, "Skip the host_call which is executed every step.")

NUM_CLASSES = 10
NUM_TRAIN_IMAGES = 1500


def digits(is_training):
  data = datasets.load_digits()
  images = np.repeat((data.images / 16.0).astype(np.float32)[..., None], 3, axis=-1)
  labels = data.target.astype(np.int32)
  if is_training:
    return images[:NUM_TRAIN_IMAGES], labels[:NUM_TRAIN_IMAGES]
  return images[NUM_TRAIN_IMAGES:], labels[NUM_TRAIN_IMAGES:]


class ImageNetInput(object):
  """Digits in the shape the ImageNet input of the image models gave: (images, labels)."""

  def __init__(self, is_training):
    self.is_training = is_training

  def input_fn(self, params):
    images, labels = digits(self.is_training)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
    if self.is_training:
      dataset = dataset.shuffle(512, seed=1)
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.data.experimental.AUTOTUNE)


def build_model(images, training):
  """Stem, one depthwise-separable block, head: the MnasNet shape at digit scale."""
  x = tf.layers.conv2d(images, 16, 3, padding="same", use_bias=False, name="stem_conv")
  x = tf.nn.relu(utils.TpuBatchNormalization(name="stem_bn")(x, training=training))
  x = tf.keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(x)
  x = tf.nn.relu(utils.TpuBatchNormalization(name="dw_bn")(x, training=training))
  x = tf.layers.conv2d(x, 32, 1, use_bias=False, name="project")
  x = utils.TpuBatchNormalization(name="project_bn")(x, training=training)
  x = tf.reduce_mean(x, [1, 2])
  return tf.layers.dense(x, NUM_CLASSES, name="head")


def model_fn(features, labels, mode, params):
  """The model_fn to be used with TPUEstimator."""
  if isinstance(features, dict):
    features = features["feature"]
  is_training = mode == tf.estimator.ModeKeys.TRAIN
  if FLAGS.use_bfloat16:
    with tf.contrib.tpu.bfloat16_scope():
      logits = tf.cast(build_model(tf.cast(features, tf.bfloat16), is_training), tf.float32)
  else:
    logits = build_model(features, is_training)

  has_moving_average_decay = FLAGS.moving_average_decay > 0
  global_step = tf.train.get_global_step()
  if has_moving_average_decay:
    ema = tf.train.ExponentialMovingAverage(decay=FLAGS.moving_average_decay,
                                            num_updates=global_step)
    ema_vars = utils.get_ema_vars()

  def scaffold_fn():
    restore_vars_dict = ema.variables_to_restore(ema_vars)
    saver = tf.train.Saver(restore_vars_dict)
    return tf.train.Scaffold(saver=saver)

  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": tf.argmax(logits, axis=1),
                   "probabilities": tf.nn.softmax(logits, name="softmax_tensor")}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode=mode, predictions=predictions,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)},
        scaffold_fn=scaffold_fn if has_moving_average_decay else None)

  one_hot_labels = tf.one_hot(labels, NUM_CLASSES)
  cross_entropy = tf.losses.softmax_cross_entropy(
      logits=logits, onehot_labels=one_hot_labels, label_smoothing=0.1)
  loss = cross_entropy + 1e-5 * tf.add_n(
      [tf.nn.l2_loss(v) for v in tf.trainable_variables() if "bn" not in v.name])

  host_call = None
  train_op = None
  if is_training:
    steps_per_epoch = NUM_TRAIN_IMAGES / FLAGS.train_batch_size
    learning_rate = utils.build_learning_rate(
        FLAGS.base_learning_rate * (FLAGS.train_batch_size / 256.0), global_step,
        steps_per_epoch)
    optimizer = tf.train.RMSPropOptimizer(learning_rate, decay=0.9, momentum=0.9, epsilon=1e-3)
    if FLAGS.use_tpu:
      optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
      train_op = optimizer.minimize(loss, global_step)
    if has_moving_average_decay:
      with tf.control_dependencies([train_op]):
        train_op = ema.apply(ema_vars)

    if not FLAGS.skip_host_call:
      def host_call_fn(gs, lr, ce):
        gs = gs[0]
        with tf.contrib.summary.create_file_writer(FLAGS.model_dir, max_queue=1).as_default():
          with tf.contrib.summary.always_record_summaries():
            tf.contrib.summary.scalar("learning_rate", lr[0], step=gs)
            tf.contrib.summary.scalar("current_epoch", tf.cast(gs, tf.float32) / steps_per_epoch,
                                      step=gs)
            tf.contrib.summary.scalar("cross_entropy", ce[0], step=gs)
            return tf.contrib.summary.all_summary_ops()

      host_call = (host_call_fn, [tf.reshape(global_step, [1]), tf.reshape(learning_rate, [1]),
                                  tf.reshape(cross_entropy, [1])])

  eval_metrics = None
  if mode == tf.estimator.ModeKeys.EVAL:
    def metric_fn(labels, logits):
      predictions = tf.argmax(logits, axis=1)
      top_1_accuracy = tf.metrics.accuracy(labels, predictions)
      in_top_5 = tf.cast(tf.nn.in_top_k(logits, labels, 5), tf.float32)
      return {"top_1_accuracy": top_1_accuracy, "top_5_accuracy": tf.metrics.mean(in_top_5)}

    eval_metrics = (metric_fn, [labels, logits])

  return tf.contrib.tpu.TPUEstimatorSpec(
      mode=mode, loss=loss, train_op=train_op, host_call=host_call, eval_metrics=eval_metrics,
      scaffold_fn=scaffold_fn if has_moving_average_decay and not is_training else None)


def serving_input_fn():
  images = tf.placeholder(tf.float32, [None, 8, 8, 3], name="images")
  return tf.estimator.export.TensorServingInputReceiver(images, images)


def main(unused_argv):
  tf.logging.set_verbosity(tf.logging.INFO)
  tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
      FLAGS.tpu if FLAGS.use_tpu else None)
  config = tf.contrib.tpu.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.iterations_per_loop,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop, num_shards=8,
          per_host_input_for_training=tf.contrib.tpu.InputPipelineConfig.PER_HOST_V2))
  classifier = tf.contrib.tpu.TPUEstimator(
      use_tpu=FLAGS.use_tpu, model_fn=model_fn, config=config,
      train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
      export_to_tpu=False)
  classifier.train(input_fn=ImageNetInput(True).input_fn, max_steps=FLAGS.train_steps)
  eval_steps = (1797 - NUM_TRAIN_IMAGES) // FLAGS.eval_batch_size
  eval_results = classifier.evaluate(input_fn=ImageNetInput(False).input_fn, steps=eval_steps)
  tf.logging.info("Eval results: %s", eval_results)
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "eval_results.txt"), "w") as writer:
    for key in sorted(eval_results):
      writer.write("%s = %s\n" % (key, eval_results[key]))
  if FLAGS.export_dir:
    classifier.export_saved_model(FLAGS.export_dir, serving_input_fn)


if __name__ == "__main__":
  app.run(main)
