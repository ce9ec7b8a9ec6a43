"""SessionRunHooks given to train(), evaluate() and predict(): what each saw, step by step.

  python logging_hooks.py --model_dir=MODEL --results=RESULTS.json

A TPUEstimator (use_tpu=False, 4 iterations per loop) fits a linear model to
numpy data, naming its tensors (`total_loss`, `mean_prediction`) so hooks made
outside the model_fn can ask for them. train() runs TensorFlow's own hooks
(LoggingTensorHook every 3 iterations, once a day and at the end, each with a
formatter that records what it is given; NanTensorHook; StepCounterHook;
FinalOpsHook; StopAtStepHook by num_steps and by last_step;
GlobalStepWaiterHook) and a hook of the program's own that fetches a nested
structure in before_run and reads the global step through the session in
after_run; evaluate() and predict() run hooks too. Everything the hooks saw,
the checkpoints and evaluate()'s dict go to --results as JSON.

--nan_at_step=N makes the loss NaN from step N on: with --fail_on_nan_loss the
NanTensorHook stops training with NanLossDuringTrainingError, without it the
hook asks the session to stop.
"""

import glob
import json
import os

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write what the hooks saw (JSON).")
flags.DEFINE_integer("iterations", 4, "iterations_per_loop.")
flags.DEFINE_integer("nan_at_step", -1, "The loss is NaN from this step on (-1: never).")
flags.DEFINE_bool("fail_on_nan_loss", True, "NanTensorHook's fail_on_nan_loss.")

BATCH = 8


def plain(value):
  """A hook's numpy results as JSON: arrays to lists, numpy scalars to numbers."""
  if isinstance(value, dict):
    return {str(key): plain(item) for key, item in sorted(value.items())}
  if isinstance(value, (list, tuple)):
    return [plain(item) for item in value]
  if isinstance(value, bytes):
    return value.decode()
  if isinstance(value, (np.ndarray, np.generic)):
    return value.tolist()
  return value


def data():
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  y = (x.dot(np.array([[1.0], [2.0], [-1.0], [0.5]])) + 0.5).astype(np.float32)
  return x, y


def input_fn(params, repeat=True):
  x, y = data()
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
  if repeat:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
  """A linear model; its loss and mean prediction named for the hooks."""
  del params
  weights = tf.get_variable("weights", [4, 1], initializer=tf.zeros_initializer())
  bias = tf.get_variable("bias", [1], initializer=tf.zeros_initializer())
  predictions = tf.matmul(features["x"], weights) + bias
  mean_prediction = tf.identity(tf.reduce_mean(predictions), name="mean_prediction")
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions={"prediction": predictions[:, 0],
                           "mean": tf.fill([BATCH], mean_prediction)})
  loss = tf.reduce_mean(tf.square(predictions - labels))
  if FLAGS.nan_at_step >= 0:
    late = tf.train.get_global_step() >= FLAGS.nan_at_step
    loss = tf.where(late, tf.constant(np.nan, tf.float32), loss)
  loss = tf.identity(loss, name="total_loss")
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, loss=loss,
        eval_metrics=(lambda p: {"mean_prediction": tf.metrics.mean(p)}, [predictions]))
  optimizer = tf.train.GradientDescentOptimizer(0.05)
  train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


class Formatter:
  """A LoggingTensorHook formatter that keeps every dict of values it is given."""

  def __init__(self):
    self.seen = []

  def __call__(self, values):
    self.seen.append(plain(values))
    return "recorded " + ", ".join(sorted(values))


class FetchingHook(tf.train.SessionRunHook):
  """A program's own hook: a nested fetch each step, the session's global step after it."""

  def __init__(self, fetches):
    self._fetches = fetches
    self.seen = []
    self.calls = []

  def begin(self):
    self._global_step = tf.train.get_global_step()
    self.calls.append("begin")

  def after_create_session(self, session, coord):
    del coord
    self.calls.append(["after_create_session", plain(session.run(self._global_step))])

  def before_run(self, run_context):
    return tf.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    self.seen.append({"results": plain(run_values.results),
                      "global_step": plain(run_context.session.run(self._global_step))})

  def end(self, session):
    self.calls.append(["end", plain(session.run(self._global_step))])


def checkpoint_steps():
  return sorted(int(path.rsplit("-", 1)[1].split(".")[0])
                for path in glob.glob(os.path.join(FLAGS.model_dir, "model.ckpt-*.index")))


def train(estimator, results):
  """Three train() calls with TensorFlow's hooks and the program's own."""
  every_3, daily = Formatter(), Formatter()
  fetching = FetchingHook({"loss": "total_loss:0", "nested": [("mean_prediction:0",)]})
  final_ops = tf.train.FinalOpsHook({"loss": "total_loss:0"})
  hooks = [tf.train.LoggingTensorHook({"loss": "total_loss", "mean": "mean_prediction"},
                                      every_n_iter=3, formatter=every_3),
           tf.train.LoggingTensorHook(["total_loss"], every_n_secs=24 * 3600, at_end=True,
                                      formatter=daily),
           tf.train.NanTensorHook("total_loss:0", fail_on_nan_loss=FLAGS.fail_on_nan_loss),
           tf.train.StepCounterHook(every_n_steps=2,
                                    output_dir=os.path.join(FLAGS.model_dir, "step_rate")),
           fetching, final_ops]
  try:
    estimator.train(input_fn, max_steps=10, hooks=hooks)
  except tf.train.NanLossDuringTrainingError as error:
    results["nan_error"] = type(error).__name__
  results["train_1"] = {"every_3": every_3.seen, "daily": daily.seen,
                        "fetching": fetching.seen, "fetching_calls": fetching.calls,
                        "final_ops": plain(final_ops.final_ops_values),
                        "checkpoints": checkpoint_steps()}
  if "nan_error" in results or FLAGS.nan_at_step >= 0:
    return
  fetching = FetchingHook(["mean_prediction:0", "total_loss:0"])
  estimator.train(input_fn, hooks=[tf.train.StopAtStepHook(num_steps=5),
                                   tf.train.GlobalStepWaiterHook(3), fetching])
  results["train_2"] = {"fetching": fetching.seen, "fetching_calls": fetching.calls,
                        "checkpoints": checkpoint_steps()}
  estimator.train(input_fn, hooks=[tf.train.StopAtStepHook(last_step=18)])
  results["train_3"] = {"checkpoints": checkpoint_steps()}


def evaluate_and_predict(estimator, results):
  every_step = Formatter()
  fetching = FetchingHook({"loss": "total_loss:0"})
  metrics = estimator.evaluate(
      lambda params: input_fn(params, repeat=False), steps=3,
      hooks=[tf.train.LoggingTensorHook({"loss": "total_loss"}, every_n_iter=1,
                                        formatter=every_step), fetching])
  results["evaluate"] = {"metrics": plain(metrics), "every_step": every_step.seen,
                         "fetching": fetching.seen, "fetching_calls": fetching.calls}
  fetching = FetchingHook("mean_prediction:0")
  predictions = list(estimator.predict(lambda params: input_fn(params, repeat=False),
                                       hooks=[fetching]))
  results["predict"] = {"fetching": fetching.seen, "fetching_calls": fetching.calls,
                        "first": plain(predictions[0]), "count": len(predictions)}


def main(argv):
  del argv
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, save_checkpoints_steps=5,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=FLAGS.iterations))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH)
  results = {}
  train(estimator, results)
  if "train_2" in results:
    evaluate_and_predict(estimator, results)
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
