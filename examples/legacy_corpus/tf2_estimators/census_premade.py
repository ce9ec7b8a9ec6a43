"""Premade TF 2 estimators over feature columns, exported for tf.Example requests (TF 2.x style).

  python census_premade.py --model_dir=MODEL --export_dir=EXPORT

A LinearClassifier over bucketized, categorical and crossed columns and a
DNNClassifier over their embeddings, on generated census-like rows; each is
trained, evaluated and exported with a parsing serving input receiver, and the
DNN's export is loaded back with tf.saved_model.load and asked for predictions.
Writes MODEL/results.json.
"""

import json
import os

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf2 as tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the two estimators keep their checkpoints.")
flags.DEFINE_string("export_dir", None, "Where the DNN's SavedModel is exported.")
flags.DEFINE_integer("train_steps", 60, "Training steps per estimator.")

EDUCATION = ["Bachelors", "HS-grad", "Masters", "Doctorate", "Some-college"]
OCCUPATIONS = ["Tech-support", "Craft-repair", "Sales", "Exec-managerial", "Other-service"]


def make_rows(count, seed):
  """Census-like rows whose label follows age, education and hours, with noise."""
  rng = np.random.RandomState(seed)
  age = rng.randint(18, 80, count).astype(np.float32)
  education = rng.choice(EDUCATION, count)
  occupation = rng.choice(OCCUPATIONS, count)
  hours = rng.randint(10, 70, count).astype(np.float32)
  score = (age - 40) / 15 + (hours - 40) / 20 + np.isin(education, ["Masters", "Doctorate"])
  label = (score + rng.normal(0, 0.5, count) > 0.5).astype(np.int32)
  return {"age": age, "education": education, "occupation": occupation,
          "hours_per_week": hours}, label


def input_fn(features, labels, training, batch_size=64):
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  if training:
    dataset = dataset.shuffle(1000, seed=1).repeat()
  return dataset.batch(batch_size)


def build_columns():
  age = tf.feature_column.numeric_column("age")
  hours = tf.feature_column.numeric_column("hours_per_week")
  age_buckets = tf.feature_column.bucketized_column(age, boundaries=[25, 35, 45, 55, 65])
  education = tf.feature_column.categorical_column_with_vocabulary_list("education", EDUCATION)
  occupation = tf.feature_column.categorical_column_with_hash_bucket("occupation",
                                                                     hash_bucket_size=20)
  crossed = tf.feature_column.crossed_column([age_buckets, "education"], hash_bucket_size=50)
  wide = [age_buckets, education, occupation, crossed, hours]
  deep = [tf.feature_column.numeric_column("age", normalizer_fn=lambda x: (x - 45.0) / 15.0),
          tf.feature_column.numeric_column("hours_per_week",
                                           normalizer_fn=lambda x: (x - 40.0) / 15.0),
          tf.feature_column.indicator_column(education),
          tf.feature_column.embedding_column(occupation, dimension=4)]
  return wide, deep


def serialize(features, count):
  """The first `count` rows as serialized tf.Examples, as a client would send them."""
  records = []
  for i in range(count):
    feature = {
        "age": tf.train.Feature(float_list=tf.train.FloatList(value=[features["age"][i]])),
        "hours_per_week": tf.train.Feature(
            float_list=tf.train.FloatList(value=[features["hours_per_week"][i]])),
        "education": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[features["education"][i].encode()])),
        "occupation": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[features["occupation"][i].encode()])),
    }
    records.append(tf.train.Example(features=tf.train.Features(feature=feature))
                   .SerializeToString())
  return records


def main(_):
  train_x, train_y = make_rows(2000, seed=1)
  test_x, test_y = make_rows(500, seed=2)
  wide, deep = build_columns()
  linear = tf.estimator.LinearClassifier(
      feature_columns=wide, model_dir=os.path.join(FLAGS.model_dir, "linear"),
      optimizer=tf.keras.optimizers.legacy.Ftrl(learning_rate=0.1))
  dnn = tf.estimator.DNNClassifier(
      hidden_units=[16, 8], feature_columns=deep, model_dir=os.path.join(FLAGS.model_dir, "dnn"),
      optimizer=tf.keras.optimizers.legacy.Adagrad(learning_rate=0.1))
  results = {}
  for name, estimator in (("linear", linear), ("dnn", dnn)):
    estimator.train(lambda: input_fn(train_x, train_y, True), steps=FLAGS.train_steps)
    metrics = estimator.evaluate(lambda: input_fn(test_x, test_y, False))
    results[name] = {key: float(value) for key, value in metrics.items()}

  spec = tf.feature_column.make_parse_example_spec(deep)
  serving_input_fn = tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)
  export_path = dnn.export_saved_model(FLAGS.export_dir, serving_input_fn)
  loaded = tf.saved_model.load(export_path)
  served = loaded.signatures["predict"](examples=tf.constant(serialize(test_x, 8)))
  in_process = [p["probabilities"].tolist() for p in dnn.predict(
      lambda: input_fn({k: v[:8] for k, v in test_x.items()}, test_y[:8], False))]
  results["served_probabilities"] = served["probabilities"].numpy().tolist()
  results["predicted_probabilities"] = in_process
  results["export_path"] = export_path.decode() if isinstance(export_path, bytes) else export_path
  with open(os.path.join(FLAGS.model_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  flags.mark_flag_as_required("model_dir")
  flags.mark_flag_as_required("export_dir")
  app.run(main)
