"""input_fns that return tensors built in their own graph, not a Dataset, as TF 1 programs did.

TPUEstimator (as the Estimator) takes from an input_fn `(features, labels)` or
features as tensors: an iterator's `get_next()`, constants, or a queue's batch.
Training reads `--train_input` (one_shot: a one-shot iterator over
`--train_batches` shuffled batches, which ends training where it ends; constant: one
constant batch, every step; queue: `tf.train.batch` over a slice producer,
fed by queue runners); evaluation reads a finite one-shot iterator to its end
(OutOfRange, no `steps`); prediction reads features alone, from a Dataset or
(`--predict_input=one_shot`) from tensors. The model is a zero-initialized
linear classifier, so both engines compute the same numbers.
"""

import json

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf

flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_string("results", None, "Where the JSON of what the program saw goes.")
flags.DEFINE_enum("train_input", "one_shot", ["one_shot", "constant", "queue"],
                  "What the training input_fn returns.")
flags.DEFINE_enum("predict_input", "dataset", ["dataset", "one_shot"],
                  "What the prediction input_fn returns.")
flags.DEFINE_integer("train_steps", 8, "Training steps asked for.")
flags.DEFINE_integer("train_batches", 5, "Batches the one_shot training input holds.")
flags.DEFINE_integer("batch_size", 4, "Batch size.")
FLAGS = flags.FLAGS

NUM_CLASSES = 3
SHAPES = {}


def _records(count, seed):
  rng = np.random.RandomState(seed)
  features = rng.normal(size=(count, 4)).astype(np.float32)
  labels = (features[:, 0] > 0).astype(np.int32) + (features[:, 2] > 1).astype(np.int32)
  return features, labels


def train_input_fn(params):
  batch = params["batch_size"]
  features, labels = _records(FLAGS.train_batches * batch, 0)
  if FLAGS.train_input == "constant":
    return {"x": tf.constant(features[:batch])}, tf.constant(labels[:batch])
  if FLAGS.train_input == "queue":
    x, y = tf.train.slice_input_producer([features, labels], shuffle=False)
    xs, ys = tf.train.batch([x, y], batch_size=batch, num_threads=1)
    return {"x": xs}, ys
  dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, labels)).shuffle(32)
  dataset = dataset.batch(batch, drop_remainder=True)
  return tf.data.make_one_shot_iterator(dataset).get_next()


def eval_input_fn(params):
  features, labels = _records(6 * params["batch_size"], 1)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, labels))
  features, labels = tf.data.make_one_shot_iterator(
      dataset.batch(params["batch_size"], drop_remainder=True)).get_next()
  SHAPES["eval"] = [features["x"].shape.as_list(), labels.shape.as_list()]
  return features, labels


def predict_input_fn(params):
  features, _ = _records(3 * params["batch_size"], 2)
  dataset = tf.data.Dataset.from_tensor_slices({"x": features}).batch(params["batch_size"])
  if FLAGS.predict_input == "one_shot":
    return tf.data.make_one_shot_iterator(dataset).get_next()
  return dataset


def model_fn(features, labels, mode, params):
  del params
  weights = tf.get_variable("weights", [4, NUM_CLASSES], initializer=tf.zeros_initializer())
  logits = tf.matmul(features["x"], weights)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions={"logits": logits})
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = tf.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                         eval_metrics=(metric_fn, [labels, logits]))


def main(_):
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, tf_random_seed=1,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=1))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=FLAGS.batch_size,
      eval_batch_size=FLAGS.batch_size, predict_batch_size=FLAGS.batch_size)
  estimator.train(train_input_fn, max_steps=FLAGS.train_steps)
  metrics = estimator.evaluate(eval_input_fn)
  logits = [p["logits"].tolist() for p in estimator.predict(predict_input_fn)]
  with open(FLAGS.results, "w") as f:
    json.dump({"metrics": {k: float(v) for k, v in metrics.items()},
               "weights": estimator.get_variable_value("weights").tolist(),
               "logits": logits, "shapes": SHAPES}, f)


if __name__ == "__main__":
  app.run(main)
