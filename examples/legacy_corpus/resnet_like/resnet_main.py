"""Trains and evaluates the small ResNet on the 8x8 digits, tensorflow/tpu reference-model style.

  python resnet_main.py --model_dir=MODEL --mode=train --train_steps=20
  python resnet_main.py --model_dir=MODEL --mode=eval --train_steps=20 --export_dir=EXPORT

--mode=eval is the eval job that ran beside a TPU training job: it evaluates
each new checkpoint as it appears, until one at --train_steps or until none
comes for --eval_timeout seconds.
"""

import os
import time

from absl import app
from absl import flags
import numpy as np
import resnet_model
from sklearn import datasets

from estimator_tpu.compat import tf
from tensorflow.contrib import summary
from tensorflow.contrib.tpu.python.tpu import async_checkpoint
from tensorflow.contrib.tpu.python.tpu import tpu_config
from tensorflow.contrib.tpu.python.tpu import tpu_estimator
from tensorflow.contrib.tpu.python.tpu import tpu_optimizer
from tensorflow.contrib.training.python.training import evaluation

FLAGS = flags.FLAGS

flags.DEFINE_bool("use_tpu", False, "Use TPU to execute the model for training and evaluation.")
flags.DEFINE_string("tpu", None, "The Cloud TPU to use for training.")
flags.DEFINE_string("model_dir", None, "The directory where the model and training are stored.")
flags.DEFINE_string("export_dir", None, "Where the eval job exports a SavedModel at the end.")
flags.DEFINE_string("mode", "train_and_eval", "One of {train_and_eval, train, eval}.")
flags.DEFINE_integer("train_steps", 20, "The number of steps to use for training.")
flags.DEFINE_integer("train_batch_size", 32, "Batch size for training.")
flags.DEFINE_integer("eval_batch_size", 32, "Batch size for evaluation.")
flags.DEFINE_integer("num_eval_images", 256, "Size of the evaluation set.")
flags.DEFINE_integer("steps_per_eval", 10, "Train steps between evaluations (train_and_eval).")
flags.DEFINE_integer("iterations_per_loop", 5, "Steps per TPU loop; also the checkpoint cadence.")
flags.DEFINE_integer("eval_timeout", None, "Seconds to wait for a new checkpoint before quitting.")
flags.DEFINE_bool("skip_host_call", False, "Skip the host_call that writes summaries.")
flags.DEFINE_float("base_learning_rate", 0.1, "Base learning rate at batch size 256.")
flags.DEFINE_integer("num_label_classes", 10, "Number of classes.")

NUM_TRAIN_IMAGES = 1500
IMAGE_SIZE = 8


def digits(is_training):
  """(images [n, 8, 8, 3] float32 in [0, 1], labels [n] int32) from sklearn's bundled digits."""
  data = datasets.load_digits()
  images = (data.images / 16.0).astype(np.float32)
  images = np.repeat(images[..., None], 3, axis=-1)
  labels = data.target.astype(np.int32)
  if is_training:
    return images[:NUM_TRAIN_IMAGES], labels[:NUM_TRAIN_IMAGES]
  return images[NUM_TRAIN_IMAGES:], labels[NUM_TRAIN_IMAGES:]


class DigitsInput(object):
  """The input_fn object TPUEstimator calls with params['batch_size']."""

  def __init__(self, is_training):
    self.is_training = is_training

  def __call__(self, params):
    images, labels = digits(self.is_training)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    if self.is_training:
      dataset = dataset.apply(tf.contrib.data.shuffle_and_repeat(512, seed=1))
    else:
      dataset = dataset.repeat()
    dataset = dataset.batch(params["batch_size"], drop_remainder=True)
    return dataset.prefetch(tf.contrib.data.AUTOTUNE)


def serving_input_fn():
  images = tf.placeholder(tf.float32, [None, IMAGE_SIZE, IMAGE_SIZE, 3], name="images")
  return tf.estimator.export.TensorServingInputReceiver(images, images)


def resnet_model_fn(features, labels, mode, params):
  """The model_fn for ResNet to be used with TPUEstimator."""
  if isinstance(features, dict):
    features = features["feature"]
  network = resnet_model.resnet_v1_generator(params["num_label_classes"])
  logits = network(features, mode == tf.estimator.ModeKeys.TRAIN)
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": tf.argmax(logits, axis=1),
                   "probabilities": tf.nn.softmax(logits, name="softmax_tensor")}
    return tpu_estimator.TPUEstimatorSpec(
        mode=mode, predictions=predictions,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})

  one_hot_labels = tf.one_hot(labels, params["num_label_classes"])
  cross_entropy = tf.losses.softmax_cross_entropy(logits=logits, onehot_labels=one_hot_labels)
  loss = cross_entropy + 1e-4 * tf.add_n(
      [tf.nn.l2_loss(v) for v in tf.trainable_variables() if "batch_normalization" not in v.name])

  host_call = None
  if mode == tf.estimator.ModeKeys.TRAIN:
    global_step = tf.train.get_global_step()
    learning_rate = FLAGS.base_learning_rate * (FLAGS.train_batch_size / 256.0)
    optimizer = tf.train.MomentumOptimizer(learning_rate=learning_rate, momentum=0.9,
                                           use_nesterov=True)
    if FLAGS.use_tpu:
      optimizer = tpu_optimizer.CrossShardOptimizer(optimizer)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
      train_op = optimizer.minimize(loss, global_step)

    if not FLAGS.skip_host_call:
      def host_call_fn(gs, loss, lr):
        gs = gs[0]
        with summary.create_file_writer(FLAGS.model_dir).as_default():
          with summary.always_record_summaries():
            summary.scalar("loss", loss[0], step=gs)
            summary.scalar("learning_rate", lr[0], step=gs)
            return summary.all_summary_ops()

      gs_t = tf.reshape(global_step, [1])
      loss_t = tf.reshape(loss, [1])
      lr_t = tf.reshape(tf.constant(learning_rate), [1])
      host_call = (host_call_fn, [gs_t, loss_t, lr_t])
  else:
    train_op = None

  eval_metrics = None
  if mode == tf.estimator.ModeKeys.EVAL:
    def metric_fn(labels, logits):
      predictions = tf.argmax(logits, axis=1)
      top_1_accuracy = tf.metrics.accuracy(labels, predictions)
      in_top_5 = tf.cast(tf.nn.in_top_k(logits, labels, 5), tf.float32)
      top_5_accuracy = tf.metrics.mean(in_top_5)
      return {"top_1_accuracy": top_1_accuracy, "top_5_accuracy": top_5_accuracy}

    eval_metrics = (metric_fn, [labels, logits])

  return tpu_estimator.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                                        host_call=host_call, eval_metrics=eval_metrics)


def eval_loop(resnet_classifier, eval_steps):
  """Evaluates each new checkpoint until one at --train_steps (or --eval_timeout)."""
  eval_results = None
  for ckpt in evaluation.checkpoints_iterator(FLAGS.model_dir, timeout=FLAGS.eval_timeout):
    tf.logging.info("Starting to evaluate.")
    start_timestamp = time.time()
    eval_results = resnet_classifier.evaluate(input_fn=DigitsInput(False), steps=eval_steps,
                                              checkpoint_path=ckpt)
    elapsed_time = int(time.time() - start_timestamp)
    tf.logging.info("Eval results: %s. Elapsed seconds: %d", eval_results, elapsed_time)
    write_eval_results(eval_results)
    current_step = int(os.path.basename(ckpt).split("-")[1])
    if current_step >= FLAGS.train_steps:
      tf.logging.info("Evaluation finished after training step %d", current_step)
      break
  return eval_results


def write_eval_results(eval_results):
  path = os.path.join(FLAGS.model_dir, "eval_results.txt")
  with tf.gfile.GFile(path, "a") as writer:
    writer.write(" ".join("%s=%s" % (key, eval_results[key]) for key in sorted(eval_results)))
    writer.write("\n")


def main(unused_argv):
  tf.logging.set_verbosity(tf.logging.INFO)
  tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
      FLAGS.tpu if FLAGS.use_tpu else None)
  config = tpu_config.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.model_dir,
      save_checkpoints_steps=None,
      tpu_config=tpu_config.TPUConfig(iterations_per_loop=FLAGS.iterations_per_loop,
                                      num_shards=8))
  resnet_classifier = tpu_estimator.TPUEstimator(
      use_tpu=FLAGS.use_tpu, model_fn=resnet_model_fn, config=config,
      train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
      params={"num_label_classes": FLAGS.num_label_classes}, export_to_tpu=False)
  eval_steps = FLAGS.num_eval_images // FLAGS.eval_batch_size

  if FLAGS.mode == "eval":
    eval_loop(resnet_classifier, eval_steps)
    if FLAGS.export_dir:
      ckpt = evaluation.wait_for_new_checkpoint(FLAGS.model_dir, timeout=FLAGS.eval_timeout)
      export_path = resnet_classifier.export_saved_model(
          FLAGS.export_dir, serving_input_fn, checkpoint_path=ckpt)
      tf.logging.info("Exported %s from %s", export_path, ckpt)
    return

  hooks = [async_checkpoint.AsyncCheckpointSaverHook(
      checkpoint_dir=FLAGS.model_dir, save_steps=FLAGS.iterations_per_loop)]
  if FLAGS.mode == "train":
    resnet_classifier.train(input_fn=DigitsInput(True), max_steps=FLAGS.train_steps,
                            hooks=hooks)
    return
  if FLAGS.mode != "train_and_eval":
    raise ValueError("--mode=%s: use train_and_eval, train or eval" % FLAGS.mode)
  current_step = 0
  while current_step < FLAGS.train_steps:
    next_checkpoint = min(current_step + FLAGS.steps_per_eval, FLAGS.train_steps)
    resnet_classifier.train(input_fn=DigitsInput(True), max_steps=next_checkpoint,
                            hooks=hooks)
    current_step = next_checkpoint
    write_eval_results(resnet_classifier.evaluate(input_fn=DigitsInput(False),
                                                  steps=eval_steps))


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  app.run(main)
