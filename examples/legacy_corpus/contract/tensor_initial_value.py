"""Variables whose initial value is a tensor, under RunConfig(tf_random_seed=...).

  python tensor_initial_value.py --model_dir=MODEL --results=RESULTS.json

TF 1 computes such a variable's value by its initializer op, in the training
graph, when a run starts from nothing: `tf.Variable(tf.random.normal(...) * x)`
(its seed from the graph's), `tf.get_variable(initializer=<tensor>)` (an op
seed of its own), a value computed from another variable
(`initial_value`), beside a glorot-initialized kernel (the graph's seed too). Writes every
variable of model.ckpt-0 (the values training started from), of the last
checkpoint, and evaluate()'s results to --results as JSON.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir.")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_integer("seed", 42, "RunConfig's tf_random_seed.")
FLAGS = tf.flags.FLAGS


def model_fn(features, labels, mode, params):
  del params
  noise = tf.Variable(tf.random.normal([4, 3]) * 0.1, name="noise")
  bias = tf.get_variable("bias", initializer=tf.random.uniform([3], seed=7))
  doubled = tf.Variable(noise.initial_value * 2.0 + 1.0, name="doubled")
  kernel = tf.get_variable("hidden/kernel", [4, 4], initializer=tf.glorot_uniform_initializer())
  hidden = tf.nn.tanh(tf.matmul(features, kernel))
  logits = tf.matmul(hidden, noise * doubled) + bias
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = tf.train.GradientDescentOptimizer(0.2).minimize(loss, tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                         eval_metrics=(metric_fn, [labels, logits]))


def input_fn(params):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def checkpoint_values(path):
  return {name: tf.train.load_variable(path, name).tolist()
          for name, _ in tf.train.list_variables(path)}


def main(_):
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=8, eval_batch_size=8,
      config=tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, tf_random_seed=FLAGS.seed))
  estimator.train(input_fn, max_steps=4)
  evaluation = estimator.evaluate(input_fn, steps=2)
  results = {
      "at_start": checkpoint_values(os.path.join(FLAGS.model_dir, "model.ckpt-0")),
      "at_end": checkpoint_values(os.path.join(FLAGS.model_dir, "model.ckpt-4")),
      "eval": {key: float(value) for key, value in evaluation.items()},
  }
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
