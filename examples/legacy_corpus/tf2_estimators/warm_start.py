"""A wide-and-deep classifier warm-started from an earlier run's checkpoint (TF 2.x style).

  python warm_start.py --model_dir=MODEL

Trains a DNNLinearCombinedClassifier, then a second one on new data that starts
from the first one's weights (tf.estimator.WarmStartSettings), and records how
far one step moved them. Writes MODEL/results.json.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf2 as tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where both runs keep their checkpoints.")
flags.DEFINE_integer("train_steps", 40, "Training steps of the first run.")

COLORS = ["red", "green", "blue"]


def make_rows(count, seed):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=(count, 2)).astype(np.float32)
  color = rng.choice(COLORS, count)
  label = ((x[:, 0] + x[:, 1] + (color == "red")) > 0.5).astype(np.int32)
  return {"x": x, "color": color}, label


def input_fn(features, labels, repeat):
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  if repeat:
    dataset = dataset.shuffle(256, seed=1).repeat()
  return dataset.batch(32)


def build(model_dir, warm_start_from=None):
  color = tf.feature_column.categorical_column_with_vocabulary_list("color", COLORS)
  return tf.estimator.DNNLinearCombinedClassifier(
      model_dir=model_dir,
      linear_feature_columns=[color],
      dnn_feature_columns=[tf.feature_column.numeric_column("x", shape=[2]),
                           tf.feature_column.indicator_column(color)],
      dnn_hidden_units=[8],
      linear_optimizer=tf.keras.optimizers.legacy.Ftrl(0.05),
      dnn_optimizer=tf.keras.optimizers.legacy.Adagrad(0.05),
      warm_start_from=warm_start_from,
      config=tf.estimator.RunConfig(tf_random_seed=1))


def main(_):
  first_dir = os.path.join(FLAGS.model_dir, "first")
  second_dir = os.path.join(FLAGS.model_dir, "second")
  features, labels = make_rows(512, seed=1)
  first = build(first_dir)
  first.train(lambda: input_fn(features, labels, True), steps=FLAGS.train_steps)

  new_features, new_labels = make_rows(512, seed=2)
  settings = tf.estimator.WarmStartSettings(ckpt_to_initialize_from=first_dir,
                                            vars_to_warm_start=".*(dnn|linear)/.*")
  second = build(second_dir, warm_start_from=settings)
  second.train(lambda: input_fn(new_features, new_labels, True), steps=1)
  metrics = second.evaluate(lambda: input_fn(new_features, new_labels, False))

  moved = {}
  for name in first.get_variable_names():
    if ("dnn/" in name or "linear/" in name) and "Adagrad" not in name and "Ftrl" not in name:
      before = np.asarray(first.get_variable_value(name), np.float64)
      after = np.asarray(second.get_variable_value(name), np.float64)
      moved[name] = float(np.max(np.abs(after - before))) if before.size else 0.0
  results = {"moved_by_one_step": moved,
             "metrics": {key: float(value) for key, value in metrics.items()}}
  with open(os.path.join(FLAGS.model_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  app.run(main)
