"""Every public method and property of the TPUEstimator a program holds, and what each returns.

  python estimator_surface.py --model_dir=MODEL --results=RESULTS.json

A linear classifier on 40 fixed random points. The program calls train
(steps, max_steps already reached, saving_listeners, an input_fn whose data
ends), evaluate (before any checkpoint, steps, name, checkpoint_path),
predict (predict_keys, yield_single_examples, checkpoint_path, a prediction
that is not a dict), the three exports, get_variable_value /
get_variable_names, latest_checkpoint, eval_dir, model_dir, config, params
and model_fn, and the errors of bad arguments; it writes each result with its
Python and NumPy types to --results.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Where checkpoints and summaries go.")
tf.flags.DEFINE_string("results", None, "Where what each call returned goes, as JSON.")
FLAGS = tf.flags.FLAGS
BATCH = 4
CALLS = {"train_input_fn": 0}


def points(count=40):
  rng = np.random.RandomState(0)
  x = rng.randn(count, 3).astype(np.float32)
  return x, (x[:, 0] - x[:, 2] > 0).astype(np.int32)


def train_input_fn(params):
  CALLS["train_input_fn"] += 1
  x, y = points()
  ds = tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat()
  return ds.batch(params["batch_size"], drop_remainder=True)


def eval_input_fn(params):
  x, y = points()
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"],
                                                                  drop_remainder=True)


def finite_input_fn(params):
  x, y = points(12)  # three batches, then the data ends
  return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(params["batch_size"])


def predict_input_fn(params):
  x, _ = points(10)  # 10 records in batches of 4: the last batch holds 2
  return tf.data.Dataset.from_tensor_slices({"x": x}).batch(params["batch_size"])


def metric_fn(labels, logits):
  predicted = tf.argmax(logits, 1)
  return {"accuracy": tf.metrics.accuracy(labels, predicted),
          "mean_logits": tf.metrics.mean_tensor(tf.reduce_mean(logits, 0))}


def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(features["x"], 2, kernel_initializer=tf.zeros_initializer())
  if mode == tf.estimator.ModeKeys.PREDICT:
    class_ids = tf.argmax(logits, 1)
    if params["tensor_predictions"]:
      return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions=tf.nn.softmax(logits))
    predictions = {"class_ids": class_ids, "probabilities": tf.nn.softmax(logits),
                   "small_id": tf.cast(class_ids, tf.int32),
                   "name": tf.gather(tf.constant(["negative", "positive"]), class_ids)}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"classify": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                           eval_metrics=(metric_fn, [labels, logits]))
  optimizer = tf.train.GradientDescentOptimizer(params["learning_rate"])
  return tf.contrib.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=optimizer.minimize(loss, tf.train.get_global_step()))


def serving_input_receiver_fn():
  x = tf.placeholder(tf.float32, [None, 3], name="x")
  return tf.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


class Listener(tf.train.CheckpointSaverListener):
  def __init__(self):
    self.calls = []

  def begin(self):
    self.calls.append("begin")

  def before_save(self, session, global_step_value):
    self.calls.append(f"before_save {global_step_value}")

  def after_save(self, session, global_step_value):
    self.calls.append(f"after_save {global_step_value}")

  def end(self, session, global_step_value):
    self.calls.append(f"end {global_step_value}")


def described(value):
  """A value as JSON: its type, and a NumPy value's dtype, shape and contents."""
  if isinstance(value, dict):
    return {"type": "dict", "items": [[k, described(v)] for k, v in value.items()]}
  if isinstance(value, (np.ndarray, np.generic)):
    contents = value.tolist()
    contents = contents.decode() if isinstance(contents, bytes) else contents
    if isinstance(contents, list) and contents and isinstance(contents[0], bytes):
      contents = [c.decode() for c in contents]
    return {"type": type(value).__name__, "dtype": str(value.dtype),
            "shape": list(np.shape(value)), "value": contents}
  if isinstance(value, bytes):
    return {"type": "bytes", "value": value.decode()}
  return {"type": type(value).__name__, "value": value}


def error_of(call):
  try:
    call()
  except (ValueError, TypeError) as e:
    return f"{type(e).__name__}: {e}"
  return None


def saved_model(export_dir, tags=("serve",)):
  """What an export wrote: its files, and the signatures of its MetaGraph of `tags`."""
  export_dir = export_dir.decode() if isinstance(export_dir, bytes) else export_dir
  with tf.Graph().as_default(), tf.Session() as session:
    meta_graph = tf.saved_model.loader.load(session, list(tags), export_dir)
  return {"files": sorted(os.listdir(export_dir)), "signatures": sorted(meta_graph.signature_def)}


def build(tensor_predictions=False):
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, save_checkpoints_steps=2, keep_checkpoint_max=3,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=1))
  return tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH,
      params={"learning_rate": 0.5, "tensor_predictions": tensor_predictions})


def properties(estimator, seen):
  api = sorted(name for name in dir(tf.contrib.tpu.TPUEstimator) if not name.startswith("_"))
  seen["missing_names"] = [name for name in api if not hasattr(estimator, name)]
  seen["model_dir"] = estimator.model_dir
  params = estimator.params
  params["learning_rate"] = 99.0  # a copy: the estimator keeps its own
  seen["params"] = estimator.params
  config = estimator.config
  seen["config"] = [type(config).__name__, config.model_dir, config.keep_checkpoint_max,
                    config.log_step_count_steps, config.tpu_config.iterations_per_loop]
  seen["eval_dirs"] = [os.path.relpath(estimator.eval_dir(), FLAGS.model_dir),
                       os.path.relpath(estimator.eval_dir("holdout"), FLAGS.model_dir)]
  with tf.Graph().as_default():
    x, y = points(BATCH)
    spec = estimator.model_fn({"x": tf.constant(x)}, tf.constant(y), "train", estimator.config)
    seen["model_fn"] = [type(spec).__name__, spec.mode, spec.loss.dtype.name,
                        spec.train_op is not None]


def training(estimator, seen):
  seen["latest_checkpoint_before"] = estimator.latest_checkpoint()
  seen["get_variable_names_before"] = error_of(estimator.get_variable_names)
  seen["evaluate_untrained"] = described(estimator.evaluate(eval_input_fn, steps=1))
  seen["train_returns_the_estimator"] = estimator.train(train_input_fn, steps=3) is estimator
  calls = CALLS["train_input_fn"]  # max_steps reached: no input_fn call, the estimator back
  seen["max_steps_reached"] = [estimator.train(train_input_fn, max_steps=3) is estimator,
                               CALLS["train_input_fn"] - calls]
  estimator.train(train_input_fn, steps=2)
  listener = Listener()
  estimator.train(train_input_fn, max_steps=6, saving_listeners=[listener])
  seen["listener"] = listener.calls
  seen["latest_checkpoint"] = os.path.basename(estimator.latest_checkpoint())
  seen["get_variable_names"] = estimator.get_variable_names()
  seen["kernel"] = described(estimator.get_variable_value("dense/kernel"))
  seen["global_step"] = described(estimator.get_variable_value("global_step"))
  for name, call in (("both_steps", lambda: estimator.train(train_input_fn, steps=1, max_steps=2)),
                     ("zero_steps", lambda: estimator.train(train_input_fn, steps=0)),
                     ("zero_max_steps", lambda: estimator.train(train_input_fn, max_steps=0)),
                     ("zero_eval_steps", lambda: estimator.evaluate(eval_input_fn, steps=0))):
    seen[f"error_{name}"] = error_of(call)


def evaluation(estimator, seen):
  seen["evaluate"] = described(estimator.evaluate(eval_input_fn, steps=2))
  earlier = os.path.join(FLAGS.model_dir, "model.ckpt-5")
  seen["evaluate_named"] = described(estimator.evaluate(eval_input_fn, name="holdout",
                                                        checkpoint_path=earlier))


def prediction(estimator, seen):
  seen["predict"] = [described(p) for p in estimator.predict(predict_input_fn)]
  seen["predict_keys"] = [described(p) for p in estimator.predict(
      predict_input_fn, predict_keys=["probabilities"], yield_single_examples=False,
      checkpoint_path=os.path.join(FLAGS.model_dir, "model.ckpt-5"))]
  seen["predict_unknown_key"] = error_of(
      lambda: list(estimator.predict(predict_input_fn, predict_keys=["nothing"])))
  tensor_estimator = build(tensor_predictions=True)
  seen["predict_tensor"] = [described(p) for p in tensor_estimator.predict(predict_input_fn)]
  seen["predict_tensor_keys"] = error_of(
      lambda: list(tensor_estimator.predict(predict_input_fn, predict_keys=["a"])))


def training_receiver_fn():
  return tf.estimator.experimental.build_raw_supervised_input_receiver_fn(
      {"x": tf.zeros([BATCH, 3])}, tf.zeros([BATCH], tf.int32))


def exports(estimator, seen):
  base = os.path.join(FLAGS.model_dir, "export")
  path = estimator.export_saved_model(base, serving_input_receiver_fn)
  seen["export_saved_model"] = [type(path).__name__, saved_model(path)]
  path = estimator.export_savedmodel(base + "_v1", serving_input_receiver_fn,
                                     strip_default_attrs=True)
  seen["export_savedmodel"] = [type(path).__name__, saved_model(path)]
  path = estimator.experimental_export_all_saved_models(
      base + "_all", {tf.estimator.ModeKeys.TRAIN: training_receiver_fn(),
                      tf.estimator.ModeKeys.PREDICT: serving_input_receiver_fn})
  seen["experimental_export_all_saved_models"] = [
      type(path).__name__, saved_model(path), saved_model(path, ("train",))]


def main(argv):
  del argv
  estimator = build()
  seen = {}
  properties(estimator, seen)
  training(estimator, seen)
  evaluation(estimator, seen)
  prediction(estimator, seen)
  exports(estimator, seen)
  estimator.train(finite_input_fn)  # no steps: until the data ends
  seen["after_finite_input"] = described(estimator.get_variable_value("global_step"))
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, "checkpoint")) as f:
    seen["checkpoint_state"] = f.read()
  with open(FLAGS.results, "w") as f:
    json.dump(seen, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
