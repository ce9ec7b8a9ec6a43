"""A Scaffold's init_fn warm start, as Inception v3's and slim's training scripts wrote it.

  python scaffold_init_fn.py --model_dir=MODEL --results=RESULTS.json [--init=saver|slim]

First writes a "pretrained" checkpoint of its own (a graph and a session at the top
level). The model_fn's scaffold_fn then gives a Scaffold whose init_fn restores the
dense layer from it: `saver.restore(session, path)` with a Saver over the model's
variables (--init=saver), or slim's `assign_from_checkpoint_fn` over
`get_variables_to_restore` (--init=slim). TF 1 calls init_fn once, when a run starts
from nothing: the first train() starts from the pretrained values (model.ckpt-0 holds
them), the second resumes from model_dir without calling it again, and evaluate()
restores the checkpoint. Writes what it saw to --results as JSON.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

slim = tf.contrib.slim

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir.")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_enum("init", "saver", ["saver", "slim"], "How init_fn restores the layer.")
FLAGS = tf.flags.FLAGS

PRETRAINED = {"pretrained/kernel": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3),
              "pretrained/bias": np.array([0.5, -0.25, 0.125], np.float32)}
INIT_CALLS = []


def write_pretrained(path):
  """A checkpoint of another model: its variables are named pretrained/*."""
  tf.gfile.MakeDirs(os.path.dirname(path))
  with tf.Graph().as_default():
    for name, value in PRETRAINED.items():
      tf.get_variable(name, initializer=value)
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      tf.train.Saver().save(session, path)


def scaffold_fn_for(pretrained_path):
  """The scaffold_fn: an init_fn that restores dense/* from pretrained/*."""

  def scaffold_fn():
    if FLAGS.init == "saver":
      dense = {v.op.name: v for v in tf.global_variables() if v.op.name.startswith("dense/")}
      saver = tf.train.Saver({"pretrained/" + name.split("/")[1]: v for name, v in dense.items()})

      def init_fn(scaffold, session):
        INIT_CALLS.append([type(scaffold).__name__, type(session).__name__])
        saver.restore(session, pretrained_path)
    else:
      variables = slim.get_variables_to_restore(include=["dense"])
      restore = slim.assign_from_checkpoint_fn(
          pretrained_path, {"pretrained/" + v.op.name.split("/")[1]: v for v in variables})

      def init_fn(scaffold, session):
        INIT_CALLS.append([type(scaffold).__name__, type(session).__name__])
        restore(session)
    return tf.train.Scaffold(init_fn=init_fn)

  return scaffold_fn


def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(features, 3, name="dense")
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  scaffold_fn = scaffold_fn_for(params["pretrained"])
  if mode == tf.estimator.ModeKeys.TRAIN:
    optimizer = tf.train.GradientDescentOptimizer(0.1)
    train_op = optimizer.minimize(loss, tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                           scaffold_fn=scaffold_fn)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

  # TF 1 restores the checkpoint for evaluation: the scaffold's init_fn does not run.
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=scaffold_fn,
                                         eval_metrics=(metric_fn, [labels, logits]))


def input_fn(params):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def checkpoint_values(path):
  return {name: tf.train.load_variable(path, name).tolist()
          for name in ("dense/kernel", "dense/bias")}


def main(_):
  pretrained_path = os.path.join(FLAGS.model_dir + "_pretrained", "model.ckpt")
  write_pretrained(pretrained_path)
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=8, eval_batch_size=8,
      params={"pretrained": pretrained_path},
      config=tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=100))
  estimator.train(input_fn, max_steps=3)
  after_first = len(INIT_CALLS)
  estimator.train(input_fn, max_steps=5)
  evaluation = estimator.evaluate(input_fn, steps=2)
  results = {
      "init_calls": INIT_CALLS,
      "init_calls_after_first_train": after_first,
      "at_start": checkpoint_values(os.path.join(FLAGS.model_dir, "model.ckpt-0")),
      "at_end": checkpoint_values(os.path.join(FLAGS.model_dir, "model.ckpt-5")),
      "eval": {key: float(value) for key, value in evaluation.items()},
  }
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
