"""The estimator's log: train, evaluate (plain and named), predict and export, with INFO on.

  python estimator_voice.py --model_dir=MODEL --results=RESULTS.json [--quiet]

A linear classifier on 48 fixed random points: trains 6 steps (a checkpoint
every 3, the step rate every 2), evaluates twice, predicts and exports, with
`tf.logging.set_verbosity(tf.logging.INFO)` (WARN with --quiet). What it
logs is the estimator's own INFO lines; its results go to --results.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Where checkpoints and summaries go.")
tf.flags.DEFINE_string("results", None, "Where the evaluation results go, as JSON.")
tf.flags.DEFINE_integer("train_steps", 6, "Training steps.")
tf.flags.DEFINE_integer("iterations", 1, "Steps per training loop.")
tf.flags.DEFINE_bool("quiet", False, "Log at WARN, not INFO.")
FLAGS = tf.flags.FLAGS
BATCH = 8


def points():
  rng = np.random.RandomState(0)
  x = rng.randn(48, 4).astype(np.float32)
  return x, (x[:, 0] + x[:, 1] > 0).astype(np.int32)


def input_fn(params):
  x, y = points()
  ds = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  return ds.repeat().batch(params["batch_size"], drop_remainder=True)


def eval_input_fn(params):
  x, y = points()
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"],
                                                                  drop_remainder=True)


def predict_input_fn(params):
  x, _ = points()
  return tf.data.Dataset.from_tensor_slices({"x": x[:12]}).batch(params["batch_size"])


def metric_fn(labels, logits):
  return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, 1))}


def model_fn(features, labels, mode, params):
  del params
  logits = tf.layers.dense(features["x"], 2, kernel_initializer=tf.zeros_initializer())
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"class_ids": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                           eval_metrics=(metric_fn, [labels, logits]))
  optimizer = tf.train.GradientDescentOptimizer(0.5)
  train_op = optimizer.minimize(loss, tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def serving_input_receiver_fn():
  x = tf.placeholder(tf.float32, [None, 4], name="x")
  return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


def main(argv):
  del argv
  tf.logging.set_verbosity(tf.logging.WARN if FLAGS.quiet else tf.logging.INFO)
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, save_checkpoints_steps=3, log_step_count_steps=2,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=FLAGS.iterations))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH)
  estimator.train(input_fn, max_steps=FLAGS.train_steps)
  results = estimator.evaluate(eval_input_fn, steps=2)
  named = estimator.evaluate(eval_input_fn, name="holdout")
  predictions = list(estimator.predict(predict_input_fn))
  export = estimator.export_saved_model(os.path.join(FLAGS.model_dir, "export"),
                                        serving_input_receiver_fn)
  with open(FLAGS.results, "w") as f:
    json.dump({"evaluate": {k: v.item() for k, v in results.items()},
               "named": {k: v.item() for k, v in named.items()},
               "predictions": [p["probabilities"].tolist() for p in predictions],
               "export": os.path.basename(export.decode())}, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
