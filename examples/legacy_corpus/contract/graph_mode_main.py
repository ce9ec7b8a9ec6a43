"""A TF 1 main: placeholders, a Session, a FileWriter and a Saver at the top level, around training.

The program computes its input statistics with a placeholder in a session it
keeps open while the TPUEstimator trains and evaluates, writes them with a
`tf.summary.FileWriter`, and afterwards restores the trained weights with a
`tf.train.Saver` into its own graph to compute logits, which it compares with
`predict()`. With `--disable_v2_behavior` it first calls
`tf.disable_v2_behavior()`, as TF 1 programs moved to TF 2 often do.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf

flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_string("results", None, "Where the JSON of what the program saw goes.")
flags.DEFINE_bool("disable_v2_behavior", False, "Call tf.disable_v2_behavior() first.")
flags.DEFINE_integer("train_steps", 6, "Training steps.")
FLAGS = flags.FLAGS

BATCH = 4
SEEN = {}


def _records(count, seed):
  rng = np.random.RandomState(seed)
  features = rng.normal(loc=2.0, scale=3.0, size=(count, 4)).astype(np.float32)
  labels = (features[:, 0] > 2).astype(np.int32)
  return features, labels


def input_statistics(session, features):
  """Mean and standard deviation of each column, by a placeholder fed in session."""
  data = tf.placeholder(tf.float32, [None, 4], name="data")
  mean, variance = tf.nn.moments(data, axes=[0])
  return session.run([mean, tf.sqrt(variance)], feed_dict={data: features})


def make_input_fn(features, labels, mean, std, training):
  def input_fn(params):
    SEEN.setdefault("input_fn_executing_eagerly", []).append(tf.executing_eagerly())
    normalized = (features - mean) / std
    dataset = tf.data.Dataset.from_tensor_slices(({"x": normalized.astype(np.float32)}, labels))
    if training:
      dataset = dataset.repeat()
    return dataset.batch(params["batch_size"], drop_remainder=True)
  return input_fn


def model_fn(features, labels, mode, params):
  del params
  weights = tf.get_variable("weights", [4, 2], initializer=tf.zeros_initializer())
  logits = tf.matmul(features["x"], weights)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = None
  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = tf.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def restored_logits(checkpoint, features):
  """The trained model's logits, by the program's own graph, Saver and Session."""
  with tf.Graph().as_default():
    data = tf.placeholder(tf.float32, [None, 4])
    weights = tf.get_variable("weights", [4, 2])
    logits = tf.matmul(data, weights)
    saver = tf.train.Saver([weights])
    with tf.Session() as session:
      saver.restore(session, checkpoint)
      return session.run(logits, feed_dict={data: features})


def main(_):
  if FLAGS.disable_v2_behavior:
    tf.disable_v2_behavior()
  SEEN["main_executing_eagerly"] = tf.executing_eagerly()
  features, labels = _records(32, 0)
  log_dir = os.path.join(FLAGS.model_dir, "statistics")
  writer = tf.summary.FileWriter(log_dir, tf.get_default_graph())
  with tf.Session() as session:
    mean, std = input_statistics(session, features)
    config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, tf_random_seed=1)
    estimator = tf.contrib.tpu.TPUEstimator(
        model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
        eval_batch_size=BATCH, predict_batch_size=BATCH)
    estimator.train(make_input_fn(features, labels, mean, std, True),
                    max_steps=FLAGS.train_steps)
    metrics = estimator.evaluate(make_input_fn(features, labels, mean, std, False))
    # The session and its graph are still the program's, after the engine ran.
    mean_again = session.run(tf.get_default_graph().get_tensor_by_name("moments/Squeeze:0"),
                             feed_dict={"data:0": features})
  writer.add_summary(tf.Summary(value=[tf.Summary.Value(tag="loss", simple_value=metrics["loss"])]),
                     int(metrics["global_step"]))
  writer.close()
  predictions = [p["logits"].tolist() for p in estimator.predict(
      make_input_fn(features, labels, mean, std, False))]
  restored = restored_logits(estimator.latest_checkpoint(), (features - mean) / std)
  SEEN["after_executing_eagerly"] = tf.executing_eagerly()
  with open(FLAGS.results, "w") as f:
    json.dump({"metrics": {k: float(v) for k, v in metrics.items()},
               "mean": mean.tolist(), "std": std.tolist(),
               "mean_again": mean_again.tolist(), "predicted": predictions,
               "restored": restored.tolist(), "seen": SEEN}, f)


if __name__ == "__main__":
  app.run(main)
