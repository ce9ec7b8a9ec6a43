"""An input_fn that reads every attribute of params['context'] and shards by its deployment.

As tensorflow/tpu's imagenet_input.py does: when TPUEstimator hands the input_fn
a context (on a TPU), the input_fn asks `current_input_fn_deployment()` which
host it is and takes that host's shard of the records; without one (TPUEstimator
with use_tpu=False) it is the only host. A linear classifier (zero-initialized,
so every run computes the same numbers) trains, evaluates and predicts; the
program writes the metrics, predictions and what each input_fn call saw.
"""

import json

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf

flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_string("results", None, "Where the JSON of what the program saw goes.")
flags.DEFINE_integer("train_steps", 6, "Training steps.")
flags.DEFINE_integer("batch_size", 8, "Global batch size.")
FLAGS = flags.FLAGS

NUM_CLASSES = 3
SEEN = {}


def _records(count, seed):
  rng = np.random.RandomState(seed)
  features = rng.normal(size=(count, 4)).astype(np.float32)
  labels = (features[:, 0] > 0).astype(np.int32) + (features[:, 1] > 1).astype(np.int32)
  return features, labels


def _context_attributes(context):
  """Everything a TPUContext answers an input_fn, as plain values."""
  device, index, count, replicas = context.current_input_fn_deployment()
  seen = {"deployment": [device, index, count, replicas],
          "num_replicas": context.num_replicas, "num_hosts": context.num_hosts,
          "current_host": context.current_host,
          "num_of_replicas_per_host": context.num_of_replicas_per_host,
          "device_for_replica": [list(context.device_for_replica(i))
                                 for i in range(context.num_replicas)],
          "host_placement": [context.tpu_host_placement_function(host_id=h)
                             for h in range(context.num_hosts)],
          "mode": getattr(context, "mode", None)}
  try:
    seen["device_assignment"] = repr(context.device_assignment)
  except RuntimeError as e:  # a model_fn's attribute, not an input_fn's
    seen["device_assignment"] = str(e)
  return seen


def make_input_fn(mode, count, seed):
  def input_fn(params):
    context = params.get("context")
    SEEN.setdefault(mode, []).append(
        {"batch_size": params["batch_size"],
         "context": None if context is None else _context_attributes(context)})
    if context is None:
      current_host, num_hosts = 0, 1
    else:
      current_host = context.current_input_fn_deployment()[1]
      num_hosts = context.num_hosts
    features, labels = _records(count, seed)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, labels))
    dataset = dataset.shard(num_hosts, current_host)
    if mode == "train":  # seeded by the RunConfig's tf_random_seed, as TF 1 seeds a graph
      dataset = dataset.shuffle(64).repeat()
    if mode == "predict":
      dataset = dataset.map(lambda features, labels: features)
    return dataset.batch(params["batch_size"], drop_remainder=True)
  return input_fn


def model_fn(features, labels, mode, params):
  SEEN.setdefault("model_fn_has_context", []).append("context" in params)
  weights = tf.get_variable("weights", [4, NUM_CLASSES], initializer=tf.zeros_initializer())
  bias = tf.get_variable("bias", [NUM_CLASSES], initializer=tf.zeros_initializer())
  logits = tf.matmul(features["x"], weights) + bias
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions={
        "classes": tf.argmax(logits, axis=1), "logits": logits})
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    optimizer = tf.contrib.tpu.CrossShardOptimizer(tf.train.GradientDescentOptimizer(0.5))
    train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                         eval_metrics=(metric_fn, [labels, logits]))


def main(_):
  config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, tf_random_seed=1,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=3,
          per_host_input_for_training=tf.contrib.tpu.InputPipelineConfig.PER_HOST_V2))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False, train_batch_size=FLAGS.batch_size,
      eval_batch_size=FLAGS.batch_size, predict_batch_size=FLAGS.batch_size)
  estimator.train(make_input_fn("train", 64, 0), max_steps=FLAGS.train_steps)
  metrics = estimator.evaluate(make_input_fn("eval", 32, 1), steps=4)
  predictions = list(estimator.predict(make_input_fn("predict", 16, 2)))
  with open(FLAGS.results, "w") as f:
    json.dump({"metrics": {k: float(v) for k, v in metrics.items()},
               "classes": [int(p["classes"]) for p in predictions],
               "logits": [p["logits"].tolist() for p in predictions],
               "seen": SEEN}, f)


if __name__ == "__main__":
  app.run(main)
