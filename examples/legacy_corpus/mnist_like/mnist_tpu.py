"""The MNIST TPU example's shape on sklearn's bundled 8x8 digits: TPUEstimator, CPU or TPU.

  python mnist_tpu.py --model_dir=MODEL --export_dir=EXPORT --train_steps=40

Trains, evaluates (eval_metrics as (metric_fn, tensors)), predicts a few
images and exports a SavedModel that takes [batch, 8, 8] float images.
"""

import os

import numpy as np
from sklearn import datasets

from estimator_tpu.compat import tf

# Cloud TPU Cluster Resolvers
tf.flags.DEFINE_string("tpu", default=None, help="The Cloud TPU to use for training.")
tf.flags.DEFINE_string("gcp_project", default=None, help="Project name of the Cloud TPU.")
tf.flags.DEFINE_string("tpu_zone", default=None, help="GCE zone of the Cloud TPU.")

# Model specific parameters
tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir")
tf.flags.DEFINE_string("export_dir", None, "Where to export the SavedModel (optional).")
tf.flags.DEFINE_integer("batch_size", 64, "Mini-batch size for the training.")
tf.flags.DEFINE_integer("train_steps", 40, "Total number of training steps.")
tf.flags.DEFINE_integer("eval_steps", 4, "Total number of evaluation steps.")
tf.flags.DEFINE_integer("predict_examples", 10, "Images to predict after evaluation.")
tf.flags.DEFINE_float("learning_rate", 0.05, "Learning rate.")
tf.flags.DEFINE_bool("use_tpu", False, "Use TPUs rather than plain CPUs")
tf.flags.DEFINE_bool("enable_predict", True, "Do some predictions at the end")
tf.flags.DEFINE_integer("iterations", 20, "Number of iterations per TPU training loop.")
tf.flags.DEFINE_integer("num_shards", 8, "Number of shards (TPU chips).")

FLAGS = tf.flags.FLAGS


def metric_fn(labels, logits):
  accuracy = tf.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=1))
  return {"accuracy": accuracy}


def create_model(data_format="channels_last"):
  """The network: two convolutions and two dense layers on [batch, 8, 8, 1]."""

  def model(image, training):
    y = tf.reshape(image, [-1, 8, 8, 1])
    y = tf.layers.conv2d(y, 16, 3, padding="same", activation=tf.nn.relu,
                         data_format=data_format)
    y = tf.layers.max_pooling2d(y, 2, 2, padding="same", data_format=data_format)
    y = tf.layers.conv2d(y, 32, 3, padding="same", activation=tf.nn.relu,
                         data_format=data_format)
    y = tf.layers.flatten(y)
    y = tf.layers.dense(y, 64, activation=tf.nn.relu)
    y = tf.layers.dropout(y, 0.4, training=training)
    return tf.layers.dense(y, 10)

  return model


def model_fn(features, labels, mode, params):
  """model_fn constructs the ML model used to predict handwritten digits."""
  del params
  image = features
  if isinstance(image, dict):
    image = features["image"]
  model = create_model()
  if mode == tf.estimator.ModeKeys.PREDICT:
    logits = model(image, training=False)
    predictions = {"class_ids": tf.argmax(logits, axis=1),
                   "probabilities": tf.nn.softmax(logits)}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})

  logits = model(image, training=(mode == tf.estimator.ModeKeys.TRAIN))
  loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    learning_rate = tf.train.exponential_decay(
        FLAGS.learning_rate, tf.train.get_global_step(), decay_steps=100000, decay_rate=0.96)
    optimizer = tf.train.GradientDescentOptimizer(learning_rate=learning_rate)
    optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss,
        train_op=optimizer.minimize(loss, tf.train.get_global_step()))
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


def digits(training):
  data = datasets.load_digits()
  images = (data.images / 16.0).astype(np.float32)
  labels = data.target.astype(np.int32)
  return (images[:1400], labels[:1400]) if training else (images[1400:], labels[1400:])


def train_input_fn(params):
  """train_input_fn defines the input pipeline used for training."""
  batch_size = params["batch_size"]
  images, labels = digits(True)
  ds = tf.data.Dataset.from_tensor_slices((images, labels)).cache().repeat()
  ds = ds.shuffle(buffer_size=500, seed=1)
  return ds.apply(tf.contrib.data.batch_and_drop_remainder(batch_size))


def eval_input_fn(params):
  batch_size = params["batch_size"]
  images, labels = digits(False)
  ds = tf.data.Dataset.from_tensor_slices((images, labels))
  return ds.batch(batch_size, drop_remainder=True)


def predict_input_fn(params):
  batch_size = params["batch_size"]
  images, _ = digits(False)
  ds = tf.data.Dataset.from_tensor_slices(images[:FLAGS.predict_examples])
  return ds.map(lambda image: {"image": image}).batch(batch_size)


def serving_input_receiver_fn():
  image = tf.placeholder(tf.float32, [None, 8, 8], name="image")
  return tf.estimator.export.ServingInputReceiver({"image": image}, {"image": image})


def main(argv):
  del argv  # Unused.
  tf.logging.set_verbosity(tf.logging.INFO)

  tpu_cluster_resolver = None
  if FLAGS.use_tpu:
    tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
        FLAGS.tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
  run_config = tf.contrib.tpu.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.model_dir,
      session_config=tf.ConfigProto(allow_soft_placement=True, log_device_placement=False),
      tpu_config=tf.contrib.tpu.TPUConfig(FLAGS.iterations, FLAGS.num_shards))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, train_batch_size=FLAGS.batch_size,
      eval_batch_size=FLAGS.batch_size, predict_batch_size=FLAGS.batch_size,
      params={}, config=run_config, export_to_tpu=False)
  estimator.train(input_fn=train_input_fn, max_steps=FLAGS.train_steps)

  results = estimator.evaluate(input_fn=eval_input_fn, steps=FLAGS.eval_steps)
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "eval_results.txt"), "w") as writer:
    for key in sorted(results):
      writer.write("%s = %s\n" % (key, results[key]))

  if FLAGS.enable_predict:
    predictions = list(estimator.predict(input_fn=predict_input_fn))
    with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "predictions.txt"), "w") as writer:
      for prediction in predictions:
        writer.write("%d %s\n" % (prediction["class_ids"],
                                  " ".join("%.4f" % p for p in prediction["probabilities"])))
  if FLAGS.export_dir:
    estimator.export_saved_model(FLAGS.export_dir, serving_input_receiver_fn)


if __name__ == "__main__":
  tf.app.run()
