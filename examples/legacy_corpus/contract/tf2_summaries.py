"""TF 2 summary writers inside a TF 1 model_fn: the events each train() and evaluate() writes.

  python tf2_summaries.py --model_dir=MODEL --results=RESULTS.json

As 2020 self-supervised code writes its training summaries: the model_fn
makes `tf2.summary.create_file_writer(model_dir)`, puts `writer.init()` in
`tf.control_dependencies`, and under `writer.as_default()` and
`tf2.summary.record_if(global_step % 2 == 0)` writes scalars and a histogram
with `step=tf.train.get_global_step()`; evaluation writes its batches' mean
logit into model_dir/eval_tf2 with record_if(True). A TPUEstimator
(use_tpu=False) trains 5 steps in two train() calls and evaluates once;
the results hold every event of the writers' files ({directory: {tag: [[step,
value], ...]}}, values of histograms as their sum), the steps in each of
their files (one per train() or evaluate() call, as each call's session made
one) and evaluate()'s dict.
"""

import glob
import json
import os

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

tf2 = tf.compat.v2
FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write the events seen (JSON).")

BATCH = 8
EVAL_DIR = "eval_tf2"


def input_fn(params, training=True):
  rng = np.random.RandomState(1 if training else 2)
  x = rng.normal(size=(64 if training else 24, 4)).astype(np.float32)
  labels = (x.dot(np.array([1.0, -1.0, 0.5, 0.0])) > 0.2).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, labels))
  if training:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def train_summaries(loss, logits):
  """The summaries of one training step, every second step; returns the ops to run."""
  step = tf.train.get_global_step()
  writer = tf2.summary.create_file_writer(FLAGS.model_dir)
  with tf.control_dependencies([writer.init()]), writer.as_default():
    with tf2.summary.record_if(tf.equal(tf.math.floormod(step, 2), 0)):
      accuracy = tf.reduce_mean(tf.cast(tf.greater(logits[:, 1], logits[:, 0]), tf.float32))
      ops = [tf2.summary.scalar("train_loss", loss, step=step),
             tf2.summary.scalar("train/positive_rate", accuracy, step=step),
             tf2.summary.histogram("logits", logits, step=step)]
  with tf.control_dependencies(ops):
    return [writer.flush()]


def eval_summaries(logits):
  step = tf.train.get_global_step()
  writer = tf2.summary.create_file_writer(os.path.join(FLAGS.model_dir, EVAL_DIR))
  with tf.control_dependencies([writer.init()]), writer.as_default():
    with tf2.summary.record_if(True):
      return tf2.summary.scalar("eval_mean_logit", tf.reduce_mean(logits), step=step)


def model_fn(features, labels, mode, params):
  del params
  logits = tf.layers.dense(features["x"], 2, name="logits",
                           kernel_initializer=tf.zeros_initializer())
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    written = eval_summaries(logits)
    with tf.control_dependencies([written]):
      loss = tf.identity(loss)
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss)
  written = train_summaries(loss, logits)
  optimizer = tf.train.GradientDescentOptimizer(0.3)
  with tf.control_dependencies(written):
    train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def events(directory):
  """{tag: [[step, value], ...]} of the TF 2 writers' files in directory (*.v2)."""
  seen = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.*.v2"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        array = tf.make_ndarray(value.tensor)
        seen.setdefault(value.tag, []).append([event.step, float(np.sum(array))])
  return {tag: sorted(pairs) for tag, pairs in seen.items()}


def steps_by_file(directory):
  """The steps written in each TF 2 writer's file of directory, file by file."""
  return [sorted({event.step for event in tf.compat.v1.train.summary_iterator(path)
                  if event.summary.value})
          for path in sorted(glob.glob(os.path.join(directory, "events.*.v2")))]


def main(argv):
  del argv
  config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir)
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH)
  estimator.train(input_fn, steps=3)
  estimator.train(input_fn, steps=2)
  results = estimator.evaluate(lambda params: input_fn(params, training=False))
  eval_dir = os.path.join(FLAGS.model_dir, EVAL_DIR)
  seen = {"train": events(FLAGS.model_dir), "eval": events(eval_dir),
          "evaluate": {k: float(v) for k, v in sorted(results.items())},
          "files": {"train": steps_by_file(FLAGS.model_dir), "eval": steps_by_file(eval_dir)}}
  with open(FLAGS.results, "w") as f:
    json.dump(seen, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
