"""TPUEstimator reached by each import path programs use, and through a program's own subclass.

`--path` picks how the program reaches the class (tf.contrib.tpu, tf.estimator.tpu,
tf.compat.v1.estimator.tpu, tensorflow.compat.v1's estimator, the
tensorflow.contrib module path, tensorflow_estimator's module); `--subclass`
what the program builds on it: the class itself, an empty subclass, one
adding methods, one with its own __init__ (calling the base by super() or by
name), one named TPUEstimator that extends evaluate(), one overriding
latest_checkpoint(), one overriding a private hook of the Estimator. It
trains, evaluates, predicts and exports a zero-initialized linear classifier,
runs the export in a TF 1 session and writes what it saw.
"""

import importlib
import json

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf

flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_string("results", None, "Where the JSON of what the program saw goes.")
flags.DEFINE_enum("path", "contrib", ["contrib", "estimator", "compat_v1",
                                      "tensorflow_compat_v1", "contrib_module",
                                      "tensorflow_estimator"],
                  "How the program reaches TPUEstimator.")
flags.DEFINE_enum("subclass", "none", ["none", "empty", "added_method", "own_init",
                                       "base_init_by_name", "extends_evaluate",
                                       "latest_checkpoint", "private_hook"],
                  "What the program builds on TPUEstimator.")
FLAGS = flags.FLAGS

BATCH = 4


def tpu_estimator_class(path):
  if path == "contrib":
    return tf.contrib.tpu.TPUEstimator
  if path == "estimator":
    return tf.estimator.tpu.TPUEstimator
  if path == "compat_v1":
    return tf.compat.v1.estimator.tpu.TPUEstimator
  if path == "tensorflow_compat_v1":
    return importlib.import_module("tensorflow.compat.v1.estimator.tpu").TPUEstimator
  if path == "contrib_module":
    from tensorflow.contrib.tpu.python.tpu import tpu_estimator
    return tpu_estimator.TPUEstimator
  from tensorflow_estimator.python.estimator.tpu.tpu_estimator import TPUEstimator
  return TPUEstimator


def estimator_class(base, form):
  """The class the program constructs: base, or its own subclass of the given form."""
  if form == "none":
    return base

  class MyEstimator(base):
    """A program's estimator class."""

  if form == "empty":
    return MyEstimator

  class AddingEstimator(base):
    def train_then_evaluate(self, train_input_fn, eval_input_fn, steps):
      self.train(train_input_fn, max_steps=steps)
      return self.evaluate(eval_input_fn)

    @property
    def checkpoint_step(self):
      return int(self.latest_checkpoint().split("-")[-1])

  class OwnInitEstimator(base):
    def __init__(self, learning_rate, **kwargs):
      self.learning_rate = learning_rate
      super(OwnInitEstimator, self).__init__(model_fn=make_model_fn(learning_rate), **kwargs)

  class ByNameEstimator(base):
    def __init__(self, learning_rate, **kwargs):
      self.learning_rate = learning_rate
      base.__init__(self, model_fn=make_model_fn(learning_rate), **kwargs)

  class TPUEstimator(base):  # Estimator lets a class of this name override its members
    def evaluate(self, *args, **kwargs):
      results = super(TPUEstimator, self).evaluate(*args, **kwargs)
      results["evaluated_by_subclass"] = 1.0
      return results

  class FirstCheckpointEstimator(base):
    def latest_checkpoint(self):
      return tf.train.get_checkpoint_state(self.model_dir).all_model_checkpoint_paths[0]

  class GlobalStepEstimator(base):
    def _create_and_assert_global_step(self, graph):
      return super(GlobalStepEstimator, self)._create_and_assert_global_step(graph)

  return {"added_method": AddingEstimator, "own_init": OwnInitEstimator,
          "base_init_by_name": ByNameEstimator, "extends_evaluate": TPUEstimator,
          "latest_checkpoint": FirstCheckpointEstimator,
          "private_hook": GlobalStepEstimator}[form]


def make_input_fn(count, seed, training):
  def input_fn(params):
    rng = np.random.RandomState(seed)
    features = rng.normal(size=(count, 4)).astype(np.float32)
    labels = (features[:, 1] > 0).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, labels))
    if training:
      dataset = dataset.repeat()
    return dataset.batch(params["batch_size"], drop_remainder=True)
  return input_fn


def make_model_fn(learning_rate):
  def model_fn(features, labels, mode, params):
    del params
    weights = tf.get_variable("weights", [4, 2], initializer=tf.zeros_initializer())
    logits = tf.matmul(features["x"], weights)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == tf.estimator.ModeKeys.TRAIN:
      train_op = tf.train.GradientDescentOptimizer(learning_rate).minimize(
          loss, global_step=tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def serving_input_fn():
  x = tf.placeholder(tf.float32, [None, 4], name="x")
  return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


def served_logits(export_dir, features):
  """The exported SavedModel's logits, loaded and run in a TF 1 session."""
  with tf.Graph().as_default(), tf.Session() as session:
    meta_graph = tf.saved_model.loader.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    return session.run(signature.outputs["logits"].name,
                       feed_dict={signature.inputs["x"].name: features})


def main(_):
  base = tpu_estimator_class(FLAGS.path)
  cls = estimator_class(base, FLAGS.subclass)
  config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=3,
                                    tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=3))
  kwargs = dict(config=config, use_tpu=False, train_batch_size=BATCH, eval_batch_size=BATCH,
                predict_batch_size=BATCH)
  if FLAGS.subclass in ("own_init", "base_init_by_name"):
    estimator = cls(0.5, **kwargs)
  else:
    estimator = cls(model_fn=make_model_fn(0.5), **kwargs)
  seen = {"is_base": isinstance(estimator, base), "is_class": isinstance(estimator, cls),
          "is_estimator": isinstance(estimator, tf.estimator.Estimator),
          "class_name": type(estimator).__name__,
          "learning_rate": getattr(estimator, "learning_rate", None)}
  train_input_fn, eval_input_fn = make_input_fn(32, 0, True), make_input_fn(16, 1, False)
  if FLAGS.subclass == "added_method":
    metrics = estimator.train_then_evaluate(train_input_fn, eval_input_fn, 6)
    seen["checkpoint_step"] = estimator.checkpoint_step
  else:
    estimator.train(train_input_fn, max_steps=6)
    metrics = estimator.evaluate(eval_input_fn)
  logits = [p["logits"].tolist() for p in estimator.predict(make_input_fn(8, 2, False))]
  export_dir = estimator.export_saved_model(FLAGS.model_dir + "/export", serving_input_fn)
  served = served_logits(export_dir, np.eye(4, dtype=np.float32))
  with open(FLAGS.results, "w") as f:
    json.dump({"metrics": {k: float(v) for k, v in metrics.items()}, "logits": logits,
               "served": served.tolist(), "seen": seen}, f)


if __name__ == "__main__":
  app.run(main)
