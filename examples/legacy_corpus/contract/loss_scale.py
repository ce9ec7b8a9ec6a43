"""float16 with dynamic loss scaling: a TF 1 optimizer wrapped for it, the scale moving.

  python loss_scale.py --model_dir=MODEL --results=RESULTS.json

The TF 1 mixed-precision recipe for GPUs: variables stored as float32 and
read as float16 (a custom getter), the network computing in float16, the
loss in float32, and `tf.train.experimental.MixedPrecisionLossScaleOptimizer`
around a `CrossShardOptimizer(MomentumOptimizer)` with a dynamic loss scale.
The inputs are large, so at the first scale (2**15) the float16 gradients
overflow: the optimizer skips those updates and halves the scale until they
fit, then trains. The global step counts every step (added beside the
update, as the loss-scale optimizer leaves it alone on a skipped step).
Writes to --results: the loss scale and the first kernel after each
train() call, the compute dtype and the checkpoint's variable dtypes.
"""

import json

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_bool("use_tpu", False, "Use TPUs rather than plain CPUs")

FLAGS = tf.flags.FLAGS
BATCH = 8
FEATURES = 16
CLASSES = 4
STOPS = (1, 3, 12)  # train() ends at these steps; the results hold each
SEEN = {}


def float32_variable_storage_getter(getter, name, shape=None, dtype=None, **kwargs):
  """Variables asked for in float16 are stored as float32 and read as float16."""
  storage_dtype = tf.float32 if dtype == tf.float16 else dtype
  variable = getter(name, shape, dtype=storage_dtype, **kwargs)
  if dtype == tf.float16 and variable.dtype.base_dtype != tf.float16:
    variable = tf.cast(variable, tf.float16)
  return variable


def model_fn(features, labels, mode, params):
  del params
  with tf.variable_scope("net", custom_getter=float32_variable_storage_getter):
    x = tf.cast(features, tf.float16)
    hidden = tf.layers.dense(x, 32, activation=tf.nn.relu, name="hidden",
                             kernel_initializer=tf.constant_initializer(0.05))
    logits = tf.layers.dense(hidden, CLASSES, name="logits",
                             kernel_initializer=tf.constant_initializer(0.01))
  SEEN["hidden"] = hidden.dtype.name
  loss = tf.losses.sparse_softmax_cross_entropy(labels, tf.cast(logits, tf.float32))
  optimizer = tf.contrib.tpu.CrossShardOptimizer(tf.train.MomentumOptimizer(1e-5, 0.9))
  optimizer = tf.train.experimental.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
  global_step = tf.train.get_global_step()
  update = optimizer.minimize(loss)
  with tf.control_dependencies([update]):
    train_op = tf.assign_add(global_step, 1)
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn(params):
  rng = np.random.RandomState(0)
  labels = rng.randint(0, CLASSES, size=64).astype(np.int32)
  features = (rng.uniform(size=(64, FEATURES)) * 2000.0).astype(np.float32)
  ds = tf.data.Dataset.from_tensor_slices((features, labels))
  return ds.repeat().batch(params["batch_size"], drop_remainder=True)


def main(argv):
  del argv
  run_config = tf.contrib.tpu.RunConfig(
      model_dir=FLAGS.model_dir, tpu_config=tf.contrib.tpu.TPUConfig(iterations_per_loop=1))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, config=run_config, train_batch_size=BATCH)
  stops = []
  for stop in STOPS:
    estimator.train(input_fn, max_steps=stop)
    reader = tf.train.load_checkpoint(FLAGS.model_dir)
    kernel = reader.get_tensor("net/hidden/kernel")
    stops.append({"global_step": int(reader.get_tensor("global_step")),
                  "loss_scale": float(reader.get_tensor("current_loss_scale")),
                  "kernel_changed": bool(np.any(kernel != np.float32(0.05))),
                  "kernel_finite": bool(np.all(np.isfinite(kernel)))})
  dtypes = {name: dtype.name for name, dtype in reader.get_variable_to_dtype_map().items()}
  with open(FLAGS.results, "w") as f:
    json.dump({"stops": stops, "computed": dict(SEEN), "variable_dtypes": dtypes}, f,
              indent=1, sort_keys=True)


if __name__ == "__main__":
  tf.app.run()
