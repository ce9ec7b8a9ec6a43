"""TPUEstimator imported from tensorflow_estimator before `tf`, and built before `tf` is used.

A program that imports the estimator's own modules ahead of TensorFlow, and
constructs its RunConfig and TPUEstimator from them before it first touches
`tf`, gets the engine ESTIMATOR_TPU_ENGINE names all the same. (TensorFlow
2.16 and later dropped modules tensorflow_estimator imports, so there the
estimator's modules import only after `tf`: this program runs on TF 2.15.)
"""

import json

from absl import app
from absl import flags
import numpy as np
from tensorflow_estimator.python.estimator.tpu.tpu_config import RunConfig
from tensorflow_estimator.python.estimator.tpu.tpu_config import TPUConfig
from tensorflow_estimator.python.estimator.tpu.tpu_estimator import TPUEstimator
from tensorflow_estimator.python.estimator.tpu.tpu_estimator import TPUEstimatorSpec
from estimator_tpu.compat import tf

flags.DEFINE_string("model_dir", None, "Where checkpoints go.")
flags.DEFINE_string("results", None, "Where the JSON of what the program saw goes.")
FLAGS = flags.FLAGS


def input_fn(params):
  rng = np.random.RandomState(0)
  features = rng.normal(size=(16, 4)).astype(np.float32)
  labels = (features[:, 3] > 0).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices(({"x": features}, labels))
  return dataset.batch(params["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
  del params
  weights = tf.get_variable("weights", [4, 2], initializer=tf.zeros_initializer())
  logits = tf.matmul(features["x"], weights)
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = None
  if mode == tf.estimator.ModeKeys.TRAIN:
    train_op = tf.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf.train.get_global_step())
  return TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def main(_):
  config = RunConfig(model_dir=FLAGS.model_dir, tpu_config=TPUConfig(iterations_per_loop=2))
  estimator = TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                           train_batch_size=4, eval_batch_size=4)
  estimator.train(input_fn, max_steps=4)
  metrics = estimator.evaluate(input_fn)
  with open(FLAGS.results, "w") as f:
    json.dump({"metrics": {k: float(v) for k, v in metrics.items()},
               "class": type(estimator).__name__}, f)


if __name__ == "__main__":
  app.run(main)
