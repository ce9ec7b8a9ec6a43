"""A slim-era TPU image model (2018-19): slim.arg_scope, slim.nets blocks, tfexample_decoder, EMA.

  python inception_main.py --data_dir=DATA --model_dir=MODEL --export_dir=EXPORT

Writes a small TFRecord set of generated JPEGs to --data_dir (each image a
colour: the class), reads it back with slim's parallel_reader and
tfexample_decoder, and trains a small network built from slim layers under
Inception v3's arg_scope with a ResNet v1 bottleneck from slim.nets, keeping an
exponential moving average of the weights. Evaluation and export restore the
moving averages in place of the weights (a Saver over ema.variables_to_restore()).
"""

import io
import os

import numpy as np
from PIL import Image

from estimator_tpu.compat import tf
from tensorflow.contrib.framework.python.ops import arg_scope
from tensorflow.contrib.slim.nets import inception
from tensorflow.contrib.slim.nets import resnet_utils
from tensorflow.contrib.slim.nets import resnet_v1

slim = tf.contrib.slim

flags = tf.app.flags
flags.DEFINE_string("data_dir", None, "Where the TFRecords are written and read.")
flags.DEFINE_string("model_dir", None, "Checkpoints and eval results.")
flags.DEFINE_string("export_dir", None, "Where to export the SavedModel (optional).")
flags.DEFINE_integer("train_steps", 20, "Training steps.")
flags.DEFINE_integer("train_batch_size", 16, "Global training batch size.")
flags.DEFINE_integer("eval_batch_size", 16, "Global eval batch size.")
flags.DEFINE_integer("iterations_per_loop", 10, "Steps per TPU loop.")
flags.DEFINE_float("learning_rate", 0.05, "RMSProp learning rate.")
flags.DEFINE_float("moving_average_decay", 0.9, "Decay of the weights' moving average.")
flags.DEFINE_bool("use_tpu", False, "Run on a TPU.")
FLAGS = flags.FLAGS

IMAGE_SIZE = 24
NUM_CLASSES = 3
NUM_IMAGES = {"train": 96, "validation": 48}


def _jpeg(label, rng):
  pixels = rng.randint(0, 60, (IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.uint8)
  pixels[:, :, label] += 180
  buffer = io.BytesIO()
  Image.fromarray(pixels).save(buffer, format="JPEG")
  return buffer.getvalue()


def write_records(data_dir):
  """train-00000-of-00002 ... validation-00001-of-00002: tf.Examples of JPEGs."""
  tf.gfile.MakeDirs(data_dir)
  rng = np.random.RandomState(0)
  for split, count in sorted(NUM_IMAGES.items()):
    for shard in range(2):
      path = os.path.join(data_dir, "%s-%05d-of-00002" % (split, shard))
      with tf.python_io.TFRecordWriter(path) as writer:
        for _ in range(count // 2):
          label = int(rng.randint(NUM_CLASSES))
          feature = {
              "image/encoded": tf.train.Feature(
                  bytes_list=tf.train.BytesList(value=[_jpeg(label, rng)])),
              "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"jpeg"])),
              "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
          }
          example = tf.train.Example(features=tf.train.Features(feature=feature))
          writer.write(example.SerializeToString())


def decode(serialized):
  keys_to_features = {
      "image/encoded": tf.FixedLenFeature((), tf.string, default_value=""),
      "image/format": tf.FixedLenFeature((), tf.string, default_value="jpeg"),
      "image/class/label": tf.FixedLenFeature([], tf.int64, default_value=-1),
  }
  items_to_handlers = {
      "image": slim.tfexample_decoder.Image("image/encoded", "image/format", channels=3),
      "label": slim.tfexample_decoder.Tensor("image/class/label"),
  }
  decoder = slim.tfexample_decoder.TFExampleDecoder(keys_to_features, items_to_handlers)
  image, label = decoder.decode(serialized, ["image", "label"])
  image = tf.image.convert_image_dtype(image, tf.float32)
  image.set_shape([IMAGE_SIZE, IMAGE_SIZE, 3])
  return image, tf.cast(label, tf.int32)


def input_fn_builder(split):
  def input_fn(params):
    files = slim.parallel_reader.get_data_files(os.path.join(FLAGS.data_dir, split + "-*"))
    dataset = tf.data.TFRecordDataset(files)
    if split == "train":
      dataset = dataset.repeat().shuffle(64, seed=1)
    dataset = dataset.map(decode)
    return dataset.batch(params["batch_size"], drop_remainder=True)
  return input_fn


def network(images, is_training):
  with arg_scope(inception.inception_v3_arg_scope(batch_norm_decay=0.9)):
    with arg_scope([slim.batch_norm, slim.dropout], is_training=is_training):
      net = resnet_utils.conv2d_same(images, 16, 3, stride=2, scope="conv1")
      net = resnet_v1.bottleneck(net, depth=32, depth_bottleneck=8, stride=2, scope="block1")
      net = tf.reduce_mean(net, [1, 2], keep_dims=True)
      net = slim.dropout(net, 0.8, scope="dropout")
      logits = slim.conv2d(net, NUM_CLASSES, [1, 1], activation_fn=None, normalizer_fn=None,
                           scope="logits")
  return tf.squeeze(logits, [1, 2])


def ema_scaffold_fn():
  ema = tf.train.ExponentialMovingAverage(FLAGS.moving_average_decay)
  saver = tf.train.Saver(ema.variables_to_restore())
  return tf.train.Scaffold(saver=saver)


def model_fn(features, labels, mode, params):
  del params
  is_training = mode == tf.estimator.ModeKeys.TRAIN
  images = features["image"] if isinstance(features, dict) else features
  logits = network(images, is_training)
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions=predictions, scaffold_fn=ema_scaffold_fn,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})

  one_hot = slim.one_hot_encoding(labels, NUM_CLASSES)
  loss = tf.losses.softmax_cross_entropy(one_hot, logits) + tf.add_n(
      tf.losses.get_regularization_losses())
  if is_training:
    global_step = tf.train.get_or_create_global_step()
    optimizer = tf.contrib.tpu.CrossShardOptimizer(
        tf.train.RMSPropOptimizer(FLAGS.learning_rate, decay=0.9, epsilon=1.0))
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
      train_op = optimizer.minimize(loss, global_step)
    ema = tf.train.ExponentialMovingAverage(FLAGS.moving_average_decay, global_step)
    with tf.control_dependencies([train_op]):
      train_op = ema.apply(tf.trainable_variables() + tf.moving_average_variables())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, 1))}

  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=ema_scaffold_fn,
                                         eval_metrics=(metric_fn, [labels, logits]))


def serving_input_receiver_fn():
  jpegs = tf.placeholder(tf.string, [None], name="image_bytes")
  images = tf.map_fn(lambda b: tf.image.convert_image_dtype(
      tf.image.decode_jpeg(b, channels=3), tf.float32), jpegs, dtype=tf.float32)
  images.set_shape([None, IMAGE_SIZE, IMAGE_SIZE, 3])
  return tf.estimator.export.ServingInputReceiver({"image": images}, {"image_bytes": jpegs})


def main(argv):
  del argv
  tf.logging.set_verbosity(tf.logging.INFO)
  if not tf.gfile.Glob(os.path.join(FLAGS.data_dir, "train-*")):
    write_records(FLAGS.data_dir)
  run_config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir,
      tpu_config=tf.contrib.tpu.TPUConfig(FLAGS.iterations_per_loop))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, config=run_config,
      train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
      predict_batch_size=FLAGS.eval_batch_size, export_to_tpu=False)
  estimator.train(input_fn=input_fn_builder("train"), max_steps=FLAGS.train_steps)
  results = estimator.evaluate(input_fn=input_fn_builder("validation"),
                               steps=NUM_IMAGES["validation"] // FLAGS.eval_batch_size)
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "eval_results.txt"), "w") as f:
    for name in sorted(results):
      f.write("%s = %s\n" % (name, results[name]))
  if FLAGS.export_dir:
    estimator.export_saved_model(FLAGS.export_dir, serving_input_receiver_fn)


if __name__ == "__main__":
  tf.app.run(main)
