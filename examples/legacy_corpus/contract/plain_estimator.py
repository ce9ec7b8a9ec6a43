"""A program whose use_tpu=False path builds a plain Estimator: what runs it, said in one line.

  python plain_estimator.py --model_dir=MODEL --results=RESULTS.json [--use_tpu]

As 2019 TPU programs do, the model_fn is TPUEstimator's, but off TPU the
program builds `tf.estimator.Estimator(model_fn, params=...)` (its input_fn
batches with params['batch_size'] the program set itself) and unwraps the
TPUEstimatorSpec with `as_estimator_spec()`. It trains 6 steps and evaluates;
the results hold evaluate()'s dict.
"""

import json

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write evaluate()'s dict (JSON).")
flags.DEFINE_bool("use_tpu", False, "Build a TPUEstimator for a TPU.")

BATCH = 8


def input_fn(params, training=True):
  rng = np.random.RandomState(1 if training else 2)
  x = rng.normal(size=(64 if training else 40, 4)).astype(np.float32)
  labels = (x.dot(np.array([1.0, -1.0, 0.5, 0.0])) > 0.2).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, labels))
  if training:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(features["x"], 2, name="logits",
                           kernel_initializer=tf.zeros_initializer())
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    metric_fn = lambda labels, logits: {  # noqa: E731
        "accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}
    spec = tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                           eval_metrics=(metric_fn, [labels, logits]))
  else:
    optimizer = tf.train.GradientDescentOptimizer(0.3)
    if params["use_tpu"]:
      optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
    spec = tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
  return spec if params["use_tpu"] else spec.as_estimator_spec()


def main(argv):
  del argv
  if FLAGS.use_tpu:
    estimator = tf.contrib.tpu.TPUEstimator(
        model_fn=model_fn, config=tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir),
        use_tpu=True, train_batch_size=BATCH, eval_batch_size=BATCH)
  else:
    estimator = tf.estimator.Estimator(
        model_fn=model_fn, model_dir=FLAGS.model_dir,
        params={"batch_size": BATCH, "use_tpu": False})
  estimator.train(input_fn, max_steps=6)
  results = estimator.evaluate(lambda params: input_fn(params, training=False))
  with open(FLAGS.results, "w") as f:
    json.dump({k: float(v) for k, v in sorted(results.items())}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
