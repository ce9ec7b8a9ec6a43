"""model_fn(features, labels, mode, params) -> TPUEstimatorSpec, one helper per mode.

The same function runs on CPU, GPU and TPU: TPUEstimator sets
params['use_tpu'], and only TPU-specific pieces (CrossShardOptimizer, no
string outputs) look at it. params['precision'] (model/precision.py) sets
what the network computes in on every device; logits and the loss are float32.
"""

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.export import contract
from estimator_tpu.model import metrics
from estimator_tpu.model import networks
from estimator_tpu.model import optimization
from estimator_tpu.model import precision as precision_lib

ModeKeys = stacks.ModeKeys



def unpack_features(features, mode, params):
  """Features as a tensor or a dict -> (images [batch, h, w, 3], weights [batch] or None).

  Undoes the input pipeline's HWCN transpose in training and evaluation.
  """
  if isinstance(features, dict):
    images = features[schema.IMAGE_KEY]
    weights = features.get(schema.WEIGHT_KEY)
  else:
    images, weights = features, None
  if params.get("transpose_input") and mode != ModeKeys.PREDICT:
    images = input_pipeline.transpose_from_hwcn(images)
  return images, weights


def compute_logits(images, mode, params):
  """Runs the network; adds its batch-norm updates to UPDATE_OPS like tf.layers did."""
  network = networks.build_network(params)
  logits = network(images, training=mode == ModeKeys.TRAIN)
  for update in network.updates:
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
  return tf.cast(logits, tf.float32)


def classification_loss(labels, logits, weights, params):
  """Softmax cross-entropy with optional label smoothing, weighted; mean over weight > 0."""
  onehot = tf.one_hot(labels, params["num_label_classes"])
  if weights is None:
    weights = 1.0
  return tf.compat.v1.losses.softmax_cross_entropy(
      onehot, logits, weights=weights, label_smoothing=params["label_smoothing"])


def _examples_per_sec(step, global_batch):
  """float64 scalar: examples a second since the previous call (0 at the first)."""
  now = tf.timestamp()
  # (time, step) of the previous call. A callable initializer: on TPU this
  # runs inside the outfeed's control-flow context, where a tensor initial
  # value is rejected.
  last = tf.compat.v1.get_local_variable(
      "examples_per_sec_last", shape=[2], dtype=tf.float64,
      initializer=tf.compat.v1.constant_initializer([-1.0, 0.0]))
  seconds = now - last[0]
  steps = tf.cast(step, tf.float64) - last[1]
  rate = tf.where(last[0] > 0, steps * global_batch / tf.maximum(seconds, 1e-6),
                  tf.constant(0.0, tf.float64))
  with tf.control_dependencies([rate]):
    remember = last.assign(tf.stack([now, tf.cast(step, tf.float64)]))
  with tf.control_dependencies([remember]):
    return tf.identity(rate)


def _host_call(global_step, loss, lr, correct, params, loss_scale=None):
  """Training summaries written on the host: TPU-safe, and a hook off TPU.

  With params['deterministic'] there is no train/examples_per_sec: op
  determinism refuses TensorFlow's clock (tf.timestamp) inside the graph.
  With a loss_scale (float16) there is train/loss_scale.
  """
  model_dir = params["model_dir"]
  global_batch = params["train_batch_size"]
  queue = params["iterations_per_loop"]
  every_n = params.get("summary_every_n_steps", 1)
  timed = not params.get("deterministic", False)

  def host_call_fn(step, loss, lr, correct, *scale):
    step = step[0]
    with tf.compat.v2.summary.create_file_writer(model_dir, max_queue=queue).as_default():
      # On a TPU the host_call itself runs every n steps; off TPU it runs every
      # step, and only every n-th writes.
      with tf.compat.v2.summary.record_if(tf.equal(step % every_n, 0)):
        tf.compat.v2.summary.scalar("train/loss", tf.reduce_mean(loss), step=step)
        tf.compat.v2.summary.scalar("train/learning_rate", lr[0], step=step)
        tf.compat.v2.summary.scalar("train/accuracy", tf.reduce_mean(correct), step=step)
        if timed:
          tf.compat.v2.summary.scalar("train/examples_per_sec",
                                      _examples_per_sec(step, global_batch), step=step)
        if scale:
          tf.compat.v2.summary.scalar("train/loss_scale", scale[0][0], step=step)
        return tf.compat.v1.summary.all_v2_summary_ops()

  def as_vector(x):
    # host_call tensors are concatenated over cores: scalars travel as [1].
    return tf.reshape(x, [1])

  scale = [] if loss_scale is None else [as_vector(loss_scale)]
  return host_call_fn, [as_vector(global_step), as_vector(loss), as_vector(lr),
                        tf.cast(correct, tf.float32), *scale]


def _train_spec(labels, logits, params):
  global_step = tf.compat.v1.train.get_or_create_global_step()
  loss = classification_loss(labels, logits, None, params)
  loss += optimization.weight_decay_loss(
      tf.compat.v1.trainable_variables(), params["weight_decay"])
  lr = optimization.learning_rate(global_step, params)
  precision = precision_lib.of_params(params)
  optimizer = precision_lib.loss_scaled(optimization.make_optimizer(lr, params), precision)
  correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
  # Built before the update: the summaries carry the step they trained (0 first).
  host_call = _host_call(global_step, loss, lr, correct, params,
                         precision_lib.current_loss_scale(optimizer))
  update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
  with tf.control_dependencies(update_ops):
    train_op = precision_lib.train_op(optimizer, loss, global_step, precision)
  return stacks.tpu.TPUEstimatorSpec(
      mode=ModeKeys.TRAIN, loss=loss, train_op=train_op, host_call=host_call)


def make_metric_fn(num_classes):
  """metric_fn(labels, logits, weights) for eval_metrics=(metric_fn, tensors)."""

  def metric_fn(labels, logits, weights):
    return metrics.classification_metrics(labels, logits, weights, num_classes)

  return metric_fn


def _eval_spec(labels, logits, weights, params):
  if weights is None:
    weights = tf.ones_like(labels, tf.float32)
  loss = classification_loss(labels, logits, weights, params)
  return stacks.tpu.TPUEstimatorSpec(
      mode=ModeKeys.EVAL, loss=loss,
      eval_metrics=(make_metric_fn(params["num_label_classes"]),
                    [labels, logits, weights]))


def _predict_spec(logits, params):
  probabilities = tf.nn.softmax(logits)
  predictions = {
      contract.PROBABILITIES: probabilities,
      contract.CLASSID: tf.argmax(logits, axis=1, output_type=tf.int32),
  }
  class_names = params.get("class_names")
  # String tensors cannot live on a TPU: names are added only off TPU.
  if class_names and not params.get("use_tpu"):
    predictions[contract.CLASS] = tf.gather(tf.constant(list(class_names)),
                                            predictions[contract.CLASSID])
  return stacks.tpu.TPUEstimatorSpec(
      mode=ModeKeys.PREDICT, predictions=predictions,
      export_outputs={
          contract.SERVING_SIGNATURE: stacks.estimator.export.PredictOutput(predictions)})


def model_fn(features, labels, mode, params):
  """The TPUEstimator model_fn for image classification.

  Args:
    features: images float32 [batch, height, width, 3] (or [height, width, 3,
      batch] when params['transpose_input']), or a dict with `image` and,
      in evaluation, `weight` [batch] (0 for padding).
    labels: int32 [batch], 0-based; None in PREDICT mode.
    mode: a stacks.ModeKeys value.
    params: the dict of Config.to_params(), plus `batch_size`, `use_tpu` and
      `class_names` set by the estimator.

  Returns:
    A TPUEstimatorSpec.
  """
  images, weights = unpack_features(features, mode, params)
  logits = compute_logits(images, mode, params)
  if mode == ModeKeys.PREDICT:
    return _predict_spec(logits, params)
  labels = tf.cast(labels, tf.int32)
  if mode == ModeKeys.EVAL:
    return _eval_spec(labels, logits, weights, params)
  return _train_spec(labels, logits, params)
