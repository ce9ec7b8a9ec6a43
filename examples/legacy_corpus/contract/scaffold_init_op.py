"""A Scaffold's init_op with init_feed_dict, its local_init_op and its ready checks.

  python scaffold_init_op.py --model_dir=MODEL --results=RESULTS.json [--uninitialized]

The scaffold_fn gives init_op = the global initializer, then the dense bias set
from a placeholder fed by init_feed_dict; local_init_op = the default one, then
a local variable (the learning rate's scale, 0 until it runs, halved by each
step) set to 1; ready_op and ready_for_local_init_op report uninitialized
variables. TF 1 runs init_op when a run starts from nothing and local_init_op
at every session start: the second train() resumes with the scale at 1. With
--uninitialized, init_op leaves the kernel out: TF 1's ready_op stops the run,
and what it said is written. Writes what it saw to --results as JSON.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir.")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_bool("uninitialized", False, "init_op leaves dense/kernel uninitialized.")
FLAGS = tf.flags.FLAGS

START_BIAS = [0.75, -0.5, 0.25]


def scaffold_fn():
  variables = {v.op.name: v for v in tf.global_variables()}
  scale = [v for v in tf.local_variables() if v.op.name == "lr_scale"][0]
  start_bias = tf.placeholder(tf.float32, [3], name="start_bias")
  if FLAGS.uninitialized:
    init_all = tf.variables_initializer(
        [v for name, v in variables.items() if name != "dense/kernel"])
  else:
    init_all = tf.global_variables_initializer()
  with tf.control_dependencies([init_all]):
    init_op = tf.group(variables["dense/bias"].assign(start_bias), name="init_with_start_bias")
  with tf.control_dependencies([tf.train.Scaffold.default_local_init_op()]):
    local_init_op = tf.group(scale.assign(1.0), name="local_init_with_scale")
  return tf.train.Scaffold(
      init_op=init_op, init_feed_dict={start_bias: START_BIAS}, local_init_op=local_init_op,
      ready_op=tf.report_uninitialized_variables(),
      ready_for_local_init_op=tf.report_uninitialized_variables(tf.global_variables()))


def model_fn(features, labels, mode, params):
  del params
  logits = tf.layers.dense(features, 3, name="dense",
                           kernel_initializer=tf.constant_initializer(0.1))
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    # A warm restart: local_init_op sets the scale to 1 at every session start, each step halves it.
    scale = tf.get_local_variable("lr_scale", initializer=0.0)
    optimizer = tf.train.GradientDescentOptimizer(0.1 * scale)
    with tf.control_dependencies([optimizer.minimize(loss, tf.train.get_global_step())]):
      train_op = scale.assign(scale * 0.5)
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                           scaffold_fn=scaffold_fn)

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


def checkpoint_values(step):
  path = os.path.join(FLAGS.model_dir, "model.ckpt-%d" % step)
  return {name: tf.train.load_variable(path, name).tolist()
          for name in ("dense/kernel", "dense/bias")}


def main(_):
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=8, eval_batch_size=8,
      config=tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir))
  results = {}
  try:
    estimator.train(input_fn, max_steps=2)
  except RuntimeError as e:
    results["error"] = str(e).split(" Init op:")[0]
    results["uninitialized"] = str(e).split("error: ")[-1]
  else:
    after_first = checkpoint_values(2)
    estimator.train(input_fn, max_steps=4)
    results = {
        "at_start": checkpoint_values(0),
        "after_first_train": after_first,
        "after_resumed_train": checkpoint_values(4),
        "eval": {k: float(v) for k, v in estimator.evaluate(input_fn, steps=2).items()},
    }
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
