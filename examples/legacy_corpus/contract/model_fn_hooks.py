"""Hooks a model_fn returns (training_hooks, evaluation_hooks, prediction_hooks): what each saw.

  python model_fn_hooks.py --model_dir=MODEL --results=RESULTS.json [--spec=estimator]

A TPUEstimator (use_tpu=False, 3 iterations per loop) whose model_fn returns,
with its TPUEstimatorSpec (or, with --spec=estimator, an EstimatorSpec, which
TPUEstimator takes off TPU), hooks built on the tensors it made: a
LoggingTensorHook of the loss and the labels' mean, a SummarySaverHook of
the model's summaries (its summary_op; with --spec=estimator the spec's
Scaffold's, which the estimator merges), a FinalOpsHook of the weights, and
the program's own hook fetching tensors and the train op. Everything the
hooks saw goes to --results as JSON; the summaries are in MODEL/hook_summaries.
"""

import collections
import json

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write what the hooks saw (JSON).")
flags.DEFINE_enum("spec", "tpu", ["tpu", "estimator"], "TPUEstimatorSpec or EstimatorSpec.")
flags.DEFINE_integer("train_steps", 10, "Training steps.")

BATCH = 8
SEEN = collections.defaultdict(list)


def plain(value):
  """A hook's numpy results as JSON: arrays to lists, numpy scalars to numbers."""
  if isinstance(value, dict):
    return {str(key): plain(item) for key, item in sorted(value.items())}
  if isinstance(value, (list, tuple)):
    return [plain(item) for item in value]
  if isinstance(value, (np.ndarray, np.generic)):
    return value.tolist()
  return value


def input_fn(params, repeat=True):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(48, 3)).astype(np.float32)
  y = (x.dot(np.array([[1.0], [-2.0], [0.5]])) - 1.0).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  return (dataset.repeat() if repeat else dataset).batch(params["batch_size"],
                                                         drop_remainder=True)


class Recording(tf.train.SessionRunHook):
  """The program's own hook: fetches tensors each step and keeps what it got under `name`."""

  def __init__(self, name, fetches):
    self._name = name
    self._fetches = fetches

  def begin(self):
    SEEN[self._name + "_calls"].append("begin")

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    SEEN[self._name].append(plain(run_values.results))

  def end(self, session):
    SEEN[self._name + "_calls"].append("end")


class RecordingFinalOps(tf.train.FinalOpsHook):
  """FinalOpsHook that keeps its final_ops_values."""

  def end(self, session):
    super().end(session)
    SEEN["final_ops"].append(plain(self.final_ops_values))


class Formatter:
  def __init__(self, name):
    self._name = name

  def __call__(self, values):
    SEEN[self._name].append(plain(values))
    return "recorded " + self._name


def model_fn(features, labels, mode, params):
  """A linear model whose spec carries hooks of each kind."""
  del params
  weights = tf.get_variable("weights", [3, 1], initializer=tf.zeros_initializer())
  bias = tf.get_variable("bias", [1], initializer=tf.zeros_initializer())
  predictions = tf.matmul(features["x"], weights) + bias
  if mode == tf.estimator.ModeKeys.PREDICT:
    hooks = [Recording("predict", {"mean": tf.reduce_mean(predictions)})]
    return spec(mode, predictions={"y": predictions[:, 0]}, prediction_hooks=hooks)
  loss = tf.reduce_mean(tf.square(predictions - labels))
  tf.summary.scalar("loss_summary", loss)
  tf.summary.scalar("weights_norm", tf.norm(weights))
  tf.summary.histogram("predictions", predictions)
  if mode == tf.estimator.ModeKeys.EVAL:
    hooks = [Recording("evaluate", [loss, tf.reduce_mean(labels)]),
             tf.train.LoggingTensorHook({"loss": loss}, every_n_iter=2,
                                        formatter=Formatter("evaluate_logging"))]
    return spec(mode, loss=loss, evaluation_hooks=hooks)
  step = tf.train.get_global_step()
  pair = (tf.reduce_sum(predictions), tf.reduce_mean(labels))  # read before the update
  train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
  scaffold = tf.train.Scaffold() if FLAGS.spec == "estimator" else None
  summaries = (tf.train.SummarySaverHook(save_steps=3, output_dir=FLAGS.model_dir +
                                         "/hook_summaries", scaffold=scaffold)
               if scaffold else
               tf.train.SummarySaverHook(save_steps=3, output_dir=FLAGS.model_dir +
                                         "/hook_summaries", summary_op=tf.summary.merge_all()))
  hooks = [tf.train.LoggingTensorHook({"loss": loss, "mean_label": pair[1]}, every_n_iter=2,
                                      formatter=Formatter("train_logging")),
           summaries, RecordingFinalOps({"weights": tf.identity(weights), "bias": bias}),
           Recording("train", {"loss": loss, "train_op": train_op,
                               "pair": pair})]
  return spec(mode, loss=loss, train_op=train_op, training_hooks=hooks, scaffold=scaffold)


def spec(mode, scaffold=None, **kwargs):
  if FLAGS.spec == "estimator":
    return tf.estimator.EstimatorSpec(mode, scaffold=scaffold, **kwargs)
  return tf.contrib.tpu.TPUEstimatorSpec(mode, **kwargs)


def main(argv):
  del argv
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, save_checkpoints_steps=1000,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=3))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH)
  estimator.train(input_fn, max_steps=FLAGS.train_steps)
  metrics = estimator.evaluate(lambda params: input_fn(params, repeat=False))
  predictions = list(estimator.predict(lambda params: input_fn(params, repeat=False)))
  results = dict(SEEN, metrics=plain(metrics), predictions=len(predictions))
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
