"""eval_metric_ops of a plain EstimatorSpec under TPUEstimator: evaluate()'s dict, twice.

  python eval_metric_ops.py --model_dir=MODEL --results=RESULTS.json

A TPUEstimator (use_tpu=False) trains a linear classifier on numpy data
(TPUEstimatorSpec), then evaluates with a model_fn that returns a plain
EstimatorSpec, as TPUEstimator takes off TPU, whose eval_metric_ops mix
tf.metrics (accuracy, mean, auc, precision), slim's streaming metrics
(streaming_mean, aggregate_metric_map) and the program's own
(value, update_op) pair (an RMSE from a mean). It evaluates every batch of
the eval set twice (the metrics start again from zero) and once for 2 steps,
and writes evaluate()'s dicts to --results as JSON.
"""

import json

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write evaluate()'s dicts (JSON).")

BATCH = 8
slim = tf.contrib.slim


def data(training):
  rng = np.random.RandomState(1 if training else 2)
  x = rng.normal(size=(64 if training else 40, 4)).astype(np.float32)
  labels = (x.dot(np.array([1.0, -1.0, 0.5, 0.0])) > 0.2).astype(np.int32)
  return x, labels


def input_fn(params, training=True):
  x, labels = data(training)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, labels))
  if training:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def metric_ops(labels, logits):
  """Every kind of eval_metric_ops entry a TF 1 program returns."""
  probabilities = tf.nn.softmax(logits)[:, 1]
  predicted = tf.argmax(logits, axis=1, output_type=tf.int32)
  squared_error = tf.square(probabilities - tf.cast(labels, tf.float32))
  mse, mse_update = tf.metrics.mean(squared_error)
  slim_values, slim_updates = slim.metrics.aggregate_metric_map({
      "slim_accuracy": slim.metrics.streaming_accuracy(predicted, labels),
      "slim_mean_probability": slim.metrics.streaming_mean(probabilities)})
  ops = {"accuracy": tf.metrics.accuracy(labels, predicted),
         "mean_label": tf.metrics.mean(tf.cast(labels, tf.float32)),
         "auc": tf.metrics.auc(labels, probabilities),
         "precision": tf.metrics.precision(labels, predicted),
         "rmse": (tf.sqrt(mse), mse_update)}
  ops.update({name: (slim_values[name], slim_updates[name]) for name in slim_values})
  return ops


def model_fn(features, labels, mode, params):
  """A linear classifier; EVAL returns a plain EstimatorSpec with eval_metric_ops."""
  del params
  logits = tf.layers.dense(features["x"], 2, name="logits",
                           kernel_initializer=tf.zeros_initializer())
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops=metric_ops(labels, logits))
  optimizer = tf.train.GradientDescentOptimizer(0.3)
  train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def plain(results):
  return {key: np.asarray(value).item() for key, value in sorted(results.items())}


def main(argv):
  del argv
  config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir)
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH)
  estimator.train(input_fn, max_steps=6)
  evaluation = lambda params: input_fn(params, training=False)  # noqa: E731
  results = {"all": plain(estimator.evaluate(evaluation)),
             "again": plain(estimator.evaluate(evaluation)),
             "two_steps": plain(estimator.evaluate(evaluation, steps=2))}
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
