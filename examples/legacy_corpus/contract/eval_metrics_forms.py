"""Every form of TPUEstimatorSpec's eval_metrics off TPU: evaluate()'s dict for each.

  python eval_metrics_forms.py --model_dir=MODEL --results=RESULTS.json

A TPUEstimator (use_tpu=False) trains a linear classifier on numpy data, then
evaluates the same checkpoint with one TPUEstimator per form of metrics its
model_fn returns (params['form']):

- `list`: eval_metrics=(metric_fn, [labels, logits]);
- `dict`: eval_metrics=(metric_fn, {'labels': ..., 'logits': ...}), keyword arguments;
- `metric_ops`: eval_metrics={'accuracy': tf.metrics.accuracy(...), ...}, the dict of
  (value, update_op) pairs older Cloud TPU samples pass, which tf.contrib.tpu's
  TPUEstimatorSpec takes off TPU;
- `closure`: eval_metrics=(metric_fn, [labels]) whose metric_fn also reads the
  model_fn's logits and loss, which it was not given (TPUEstimator calls it in
  the model_fn's graph off TPU);
- `estimator_spec`: a plain EstimatorSpec's eval_metric_ops.

A dict of (metric_fn, tensors) pairs is refused as TPUEstimatorSpec is built;
its message goes in the results too.
"""

import json

from absl import app
from absl import flags
import numpy as np

from estimator_tpu.compat import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "Where the estimator keeps its checkpoints.")
flags.DEFINE_string("results", None, "Where to write evaluate()'s dicts (JSON).")

BATCH = 8
FORMS = ("list", "dict", "metric_ops", "closure", "estimator_spec")


def data(training):
  rng = np.random.RandomState(1 if training else 2)
  x = rng.normal(size=(64 if training else 40, 4)).astype(np.float32)
  labels = (x.dot(np.array([1.0, -1.0, 0.5, 0.0])) > 0.2).astype(np.int32)
  return x, labels


def input_fn(params, training=True):
  x, labels = data(training)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, labels))
  if training:
    dataset = dataset.repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def metric_fn(labels, logits):
  probabilities = tf.nn.softmax(logits)[:, 1]
  return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1)),
          "auc": tf.metrics.auc(labels, probabilities),
          "mean_probability": tf.metrics.mean(probabilities)}


def eval_spec(form, labels, logits, loss):
  """The EVAL spec of one form."""
  mode = tf.estimator.ModeKeys.EVAL
  if form == "estimator_spec":
    return tf.estimator.EstimatorSpec(mode, loss=loss,
                                      eval_metric_ops=metric_fn(labels, logits))
  if form == "list":
    metrics = (metric_fn, [labels, logits])
  elif form == "dict":
    metrics = (metric_fn, {"labels": labels, "logits": logits})
  elif form == "metric_ops":
    metrics = metric_fn(labels, logits)
  elif form == "closure":
    metrics = (lambda labels: dict(metric_fn(labels, logits), mean_loss=tf.metrics.mean(loss)),
               [labels])
  else:  # a dict of (metric_fn, tensors): refused
    metrics = {"accuracy": (metric_fn, [labels, logits])}
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, eval_metrics=metrics)


def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(features["x"], 2, name="logits",
                           kernel_initializer=tf.zeros_initializer())
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return eval_spec(params["form"], labels, logits, loss)
  optimizer = tf.train.GradientDescentOptimizer(0.3)
  train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def estimator(form):
  config = tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir)
  return tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, params={"form": form})


def plain(results):
  return {key: np.asarray(value).item() for key, value in sorted(results.items())}


def main(argv):
  del argv
  estimator("list").train(input_fn, max_steps=6)
  evaluation = lambda params: input_fn(params, training=False)  # noqa: E731
  results = {form: plain(estimator(form).evaluate(evaluation)) for form in FORMS}
  try:
    estimator("metric_fns").evaluate(evaluation)
  except ValueError as e:
    results["refused"] = str(e)
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "results"])
  app.run(main)
