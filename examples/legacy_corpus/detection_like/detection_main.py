"""A detection-style TPU model (2019): a box and a class per image; eval summaries by FileWriter.

  python detection_main.py --model_dir=MODEL --train_steps=20

Generated 16x16 images each hold one coloured square; the model predicts its
class (red or green) and its box [ymin, xmin, ymax, xmax]. Training runs through
TPUEstimator; then, as RetinaNet's main did, the main evaluates, computes the
mean box IoU on the host and writes the results as summaries with a
tf.summary.FileWriter of its own into model_dir/coco_eval, beside a coco_metrics.txt.
"""

import os

import numpy as np

from estimator_tpu.compat import tf
from tensorflow.gfile import MakeDirs

flags = tf.app.flags
flags.DEFINE_string("model_dir", None, "Where checkpoints and eval summaries go.")
flags.DEFINE_integer("train_steps", 20, "Training steps.")
flags.DEFINE_integer("train_batch_size", 16, "Global training batch size.")
flags.DEFINE_integer("eval_batch_size", 16, "Global eval batch size.")
flags.DEFINE_integer("eval_samples", 64, "Generated images to evaluate on.")
flags.DEFINE_integer("iterations_per_loop", 10, "Steps per TPU loop.")
flags.DEFINE_float("learning_rate", 0.05, "Momentum optimizer learning rate.")
flags.DEFINE_bool("use_tpu", False, "Run on a TPU.")
FLAGS = flags.FLAGS

IMAGE_SIZE = 16
NUM_CLASSES = 2


def make_examples(count, seed):
  """[count, 16, 16, 3] images with one square each; its class and normalized box."""
  rng = np.random.RandomState(seed)
  images = rng.uniform(0.0, 0.1, (count, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
  classes = rng.randint(0, NUM_CLASSES, count).astype(np.int32)
  boxes = np.zeros((count, 4), np.float32)
  for i in range(count):
    size = rng.randint(4, 9)
    top, left = rng.randint(0, IMAGE_SIZE - size, 2)
    images[i, top:top + size, left:left + size, classes[i]] = 1.0
    boxes[i] = np.array([top, left, top + size, left + size], np.float32) / IMAGE_SIZE
  return images, classes, boxes


def input_fn_builder(is_training):
  def input_fn(params):
    batch_size = params["batch_size"]
    count = 512 if is_training else FLAGS.eval_samples
    images, classes, boxes = make_examples(count, seed=0 if is_training else 1)
    dataset = tf.data.Dataset.from_tensor_slices(
        (images, {"classes": classes, "boxes": boxes}))
    if is_training:
      dataset = dataset.repeat().shuffle(256, seed=1)
    return dataset.batch(batch_size, drop_remainder=True)
  return input_fn


def box_net(images, is_training):
  """Returns class logits [batch, 2] and boxes [batch, 4] in [0, 1]."""
  net = tf.layers.conv2d(images, 16, 3, padding="same", activation=tf.nn.relu, name="conv1")
  net = tf.layers.batch_normalization(net, training=is_training, name="bn1")
  net = tf.layers.conv2d(net, 32, 3, strides=2, padding="same", activation=tf.nn.relu,
                         name="conv2")
  net = tf.layers.flatten(net)
  class_logits = tf.layers.dense(net, NUM_CLASSES, name="class_net")
  boxes = tf.sigmoid(tf.layers.dense(net, 4, name="box_net"))
  return class_logits, boxes


def iou(boxes_a, boxes_b):
  """Intersection over union of matching rows of two [n, 4] box arrays (numpy)."""
  top = np.maximum(boxes_a[:, 0], boxes_b[:, 0])
  left = np.maximum(boxes_a[:, 1], boxes_b[:, 1])
  bottom = np.minimum(boxes_a[:, 2], boxes_b[:, 2])
  right = np.minimum(boxes_a[:, 3], boxes_b[:, 3])
  inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
  area_a = (boxes_a[:, 2] - boxes_a[:, 0]) * (boxes_a[:, 3] - boxes_a[:, 1])
  area_b = (boxes_b[:, 2] - boxes_b[:, 0]) * (boxes_b[:, 3] - boxes_b[:, 1])
  return inter / np.maximum(area_a + area_b - inter, 1e-8)


def model_fn(features, labels, mode, params):
  del params
  is_training = mode == tf.estimator.ModeKeys.TRAIN
  class_logits, boxes = box_net(features, is_training)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions={"boxes": boxes, "classes": tf.argmax(class_logits, 1)})
  class_loss = tf.losses.sparse_softmax_cross_entropy(labels["classes"], class_logits)
  box_loss = tf.losses.huber_loss(labels["boxes"], boxes, delta=0.1)
  total_loss = class_loss + 10.0 * box_loss
  if is_training:
    optimizer = tf.contrib.tpu.CrossShardOptimizer(
        tf.train.MomentumOptimizer(FLAGS.learning_rate, momentum=0.9))
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(total_loss, tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=total_loss, train_op=train_op)

  def metric_fn(class_logits, classes, box_loss):
    return {"class_accuracy": tf.metrics.accuracy(classes, tf.argmax(class_logits, 1)),
            "box_loss": tf.metrics.mean(box_loss)}

  batch = tf.shape(class_logits)[:1]
  return tf.contrib.tpu.TPUEstimatorSpec(
      mode, loss=total_loss,
      eval_metrics=(metric_fn, [class_logits, labels["classes"], tf.fill(batch, box_loss)]))


def write_summary(eval_results, summary_writer, current_step):
  """Writes eval results as scalar summaries, as RetinaNet's main did."""
  summaries = [tf.Summary.Value(tag=name, simple_value=float(value))
               for name, value in sorted(eval_results.items()) if name != "global_step"]
  summary_writer.add_summary(tf.Summary(value=summaries), current_step)
  summary_writer.flush()


def main(argv):
  del argv
  tf.logging.set_verbosity(tf.logging.INFO)
  run_config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir,
      tpu_config=tf.contrib.tpu.TPUConfig(FLAGS.iterations_per_loop))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, config=run_config,
      train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
      predict_batch_size=FLAGS.eval_batch_size)
  estimator.train(input_fn=input_fn_builder(True), max_steps=FLAGS.train_steps)

  eval_steps = FLAGS.eval_samples // FLAGS.eval_batch_size
  eval_results = estimator.evaluate(input_fn=input_fn_builder(False), steps=eval_steps)
  _, classes, true_boxes = make_examples(FLAGS.eval_samples, seed=1)
  predictions = list(estimator.predict(input_fn=input_fn_builder(False)))
  predicted = np.stack([p["boxes"] for p in predictions])
  eval_results["mean_iou"] = float(iou(predicted, true_boxes[:len(predicted)]).mean())
  eval_results["AP50"] = float((iou(predicted, true_boxes[:len(predicted)]) > 0.5).mean())

  eval_dir = os.path.join(FLAGS.model_dir, "coco_eval")
  MakeDirs(eval_dir)
  summary_writer = tf.summary.FileWriter(eval_dir)
  write_summary(eval_results, summary_writer, int(eval_results["global_step"]))
  summary_writer.close()
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "coco_metrics.txt"), "w") as f:
    for name in sorted(eval_results):
      f.write("%s = %s\n" % (name, eval_results[name]))
  tf.logging.info("Evaluated %d images with %d classes", len(predictions), len(set(classes)))


if __name__ == "__main__":
  tf.app.run(main)
