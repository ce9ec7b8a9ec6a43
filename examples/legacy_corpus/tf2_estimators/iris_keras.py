"""A custom model_fn of Keras layers under train_and_evaluate, and a Keras model as an estimator.

  python iris_keras.py --model_dir=MODEL

TF 2.x estimator code: the model_fn builds tf.keras.layers and a Keras
(legacy) optimizer, train_and_evaluate runs it with a SessionRunHook subclass
that counts steps, then tf.keras.estimator.model_to_estimator turns a compiled
Keras model into an estimator trained on the same input_fn. Writes MODEL/results.json.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np
from sklearn import datasets
from estimator_tpu.compat import tf2 as tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimators keep their checkpoints.")
flags.DEFINE_integer("train_steps", 150, "Training steps.")


def iris(training):
  data = datasets.load_iris()
  order = np.random.RandomState(0).permutation(len(data.target))
  x, y = data.data[order].astype(np.float32), data.target[order].astype(np.int32)
  return (x[:120], y[:120]) if training else (x[120:], y[120:])


def input_fn(training, feature_key="measurements"):
  x, y = iris(training)
  dataset = tf.data.Dataset.from_tensor_slices(({feature_key: x}, y))
  if training:
    dataset = dataset.shuffle(120, seed=1).repeat()
  return dataset.batch(16)


def model_fn(features, labels, mode, params):
  """Two Dense layers; loss, train_op and metrics the TF 2 way."""
  hidden = tf.keras.layers.Dense(params["hidden_units"], activation="relu")
  output = tf.keras.layers.Dense(3)
  logits = output(hidden(features["measurements"]))
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"class_ids": tf.argmax(logits, 1)})
  loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))
  if mode == tf.estimator.ModeKeys.EVAL:
    accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))
    return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
  optimizer = tf.keras.optimizers.legacy.Adam(learning_rate=params["learning_rate"])
  optimizer.iterations = tf.compat.v1.train.get_or_create_global_step()
  variables = hidden.trainable_variables + output.trainable_variables
  train_op = optimizer.get_updates(loss, variables)[0]
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class StepCountingHook(tf.estimator.SessionRunHook):
  """Counts the training steps the session ran."""

  def __init__(self):
    self.steps = 0

  def after_run(self, run_context, run_values):
    del run_context, run_values
    self.steps += 1


def main(_):
  # Keras layers draw their initializers' seeds from Python's random module, not from the
  # graph's seed (RunConfig's tf_random_seed): seeded here, both models start the same each run.
  tf.keras.utils.set_random_seed(1)
  results = {}
  estimator = tf.estimator.Estimator(
      model_fn=model_fn, model_dir=os.path.join(FLAGS.model_dir, "custom"),
      params={"hidden_units": 16, "learning_rate": 0.05},
      config=tf.estimator.RunConfig(save_checkpoints_steps=50, tf_random_seed=1))
  counter = StepCountingHook()
  train_spec = tf.estimator.TrainSpec(lambda: input_fn(True), max_steps=FLAGS.train_steps,
                                      hooks=[counter])
  eval_spec = tf.estimator.EvalSpec(lambda: input_fn(False), steps=None, throttle_secs=0)
  metrics, _ = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
  results["custom"] = {key: float(value) for key, value in metrics.items()}
  results["hook_steps"] = counter.steps

  keras_model = tf.keras.Sequential([
      tf.keras.layers.Dense(16, activation="relu", input_shape=(4,), name="hidden"),
      tf.keras.layers.Dense(3, name="logits")])
  keras_model.compile(optimizer=tf.keras.optimizers.legacy.Adam(0.05),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
  keras_estimator = tf.keras.estimator.model_to_estimator(
      keras_model=keras_model, model_dir=os.path.join(FLAGS.model_dir, "keras"))
  key = keras_model.input_names[0]
  keras_estimator.train(lambda: input_fn(True, key), steps=FLAGS.train_steps)
  keras_metrics = keras_estimator.evaluate(lambda: input_fn(False, key))
  results["keras"] = {k: float(v) for k, v in keras_metrics.items()}
  with open(os.path.join(FLAGS.model_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  app.run(main)
