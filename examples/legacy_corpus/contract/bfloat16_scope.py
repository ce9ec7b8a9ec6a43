"""bfloat16_scope off TPU: a tf.layers network computing in bfloat16 on float32 variables.

  python bfloat16_scope.py --model_dir=MODEL --results=RESULTS.json [--precision=bfloat16]

The tensorflow/tpu models' switch (`--precision=bfloat16`): the network is
built inside `tf.contrib.tpu.bfloat16_scope()` on images cast to bfloat16,
so its convolutions and matmuls compute in bfloat16 while their variables
are float32 (the scope's custom getter stores what is asked for in
bfloat16 as float32 and reads it as bfloat16); logits are cast back to
float32 for the loss. Trains, evaluates, predicts and exports a SavedModel
that takes float32 images. Writes what it saw to --results: the compute
dtype of each layer, the checkpoint's variable dtypes, the evaluation,
the predicted classes and the export's signature dtypes.
"""

import json
import os

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_string("precision", "bfloat16", "bfloat16 or float32.")
tf.flags.DEFINE_integer("train_steps", 6, "Training steps.")
tf.flags.DEFINE_bool("use_tpu", False, "Use TPUs rather than plain CPUs")

FLAGS = tf.flags.FLAGS
BATCH = 8
SIZE = 8
CLASSES = 4
SEEN = {}  # layer name -> the dtype it computed in (from the trace or graph)


def initial(shape, seed):
  """He-normal values drawn by NumPy: both engines start from the same weights."""
  fan_in = float(np.prod(shape[:-1]))
  values = np.random.RandomState(seed).normal(size=shape) * np.sqrt(2.0 / fan_in)
  return tf.constant_initializer(values.astype(np.float32))


def network(images, training):
  """Two convolutions with batch norm and a dense layer: [batch, 8, 8, 3] -> [batch, 4]."""
  x = tf.layers.conv2d(images, 8, 3, padding="same", use_bias=False, name="conv1",
                       kernel_initializer=initial([3, 3, 3, 8], 1))
  SEEN["conv1"] = x.dtype.name
  x = tf.nn.relu(tf.layers.batch_normalization(x, training=training, name="bn1"))
  x = tf.layers.conv2d(x, 8, 3, strides=2, padding="same", name="conv2",
                       kernel_initializer=initial([3, 3, 8, 8], 2))
  x = tf.reduce_mean(tf.nn.relu(x), axis=[1, 2])
  logits = tf.layers.dense(x, CLASSES, name="logits", kernel_initializer=initial([8, CLASSES], 3))
  SEEN["logits"] = logits.dtype.name
  return logits


def build(images, training, params):
  if params["precision"] == "bfloat16":
    with tf.contrib.tpu.bfloat16_scope():
      logits = network(tf.cast(images, tf.bfloat16), training)
    return tf.cast(logits, tf.float32)
  return network(images, training)


def model_fn(features, labels, mode, params):
  images = features["image"] if isinstance(features, dict) else features
  logits = build(images, mode == tf.estimator.ModeKeys.TRAIN, params)
  if mode == tf.estimator.ModeKeys.PREDICT:
    predictions = {"classes": tf.argmax(logits, axis=1),
                   "probabilities": tf.nn.softmax(logits)}
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode, predictions=predictions,
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
  loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    def metric_fn(labels, logits):
      return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                           eval_metrics=(metric_fn, [labels, logits]))
  optimizer = tf.contrib.tpu.CrossShardOptimizer(tf.train.MomentumOptimizer(0.05, 0.9))
  with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def data():
  rng = np.random.RandomState(0)
  labels = rng.randint(0, CLASSES, size=64).astype(np.int32)
  images = rng.normal(size=(64, SIZE, SIZE, 3)).astype(np.float32)
  images += labels[:, None, None, None].astype(np.float32)  # learnable
  return images, labels


def input_fn(params):
  images, labels = data()
  ds = tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
  return ds.repeat().batch(params["batch_size"], drop_remainder=True)


def eval_input_fn(params):
  images, labels = data()
  ds = tf.data.Dataset.from_tensor_slices(({"image": images[:32]}, labels[:32]))
  return ds.batch(params["batch_size"], drop_remainder=True)


def predict_input_fn(params):
  images, _ = data()
  return tf.data.Dataset.from_tensor_slices({"image": images[:16]}).batch(params["batch_size"])


def serving_input_receiver_fn():
  image = tf.placeholder(tf.float32, [None, SIZE, SIZE, 3], name="image")
  return tf.estimator.export.ServingInputReceiver({"image": image}, {"image": image})


def signature_dtypes(export_dir):
  """{'inputs'/'outputs': {key: dtype name}} of the export's serving_default signature."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top
  saved = saved_model_pb2.SavedModel()
  with tf.gfile.GFile(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
    saved.ParseFromString(f.read())
  signature = saved.meta_graphs[0].signature_def["serving_default"]
  return {side: {key: tf.as_dtype(info.dtype).name
                  for key, info in getattr(signature, side).items()}
          for side in ("inputs", "outputs")}


def main(argv):
  del argv
  run_config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, tf_random_seed=1,
      tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=3))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, config=run_config, export_to_tpu=False,
      train_batch_size=BATCH, eval_batch_size=BATCH, predict_batch_size=BATCH,
      params={"precision": FLAGS.precision})
  estimator.train(input_fn, max_steps=FLAGS.train_steps)
  computed = dict(SEEN)
  evaluation = estimator.evaluate(eval_input_fn, steps=4)
  classes = [int(p["classes"]) for p in estimator.predict(predict_input_fn)]
  export = estimator.export_saved_model(os.path.join(FLAGS.model_dir, "export"),
                                        serving_input_receiver_fn)
  export = export.decode() if isinstance(export, bytes) else export
  reader = tf.train.load_checkpoint(FLAGS.model_dir)
  dtypes = {name: dtype.name for name, dtype in reader.get_variable_to_dtype_map().items()}
  with open(FLAGS.results, "w") as f:
    json.dump({"computed": computed, "variable_dtypes": dtypes,
               "accuracy": float(evaluation["accuracy"]), "loss": float(evaluation["loss"]),
               "global_step": int(evaluation["global_step"]), "classes": classes,
               "signature": signature_dtypes(export)}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
  tf.app.run()
