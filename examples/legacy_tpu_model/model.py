"""A digits classifier written the way the 2018 Cloud TPU tutorials wrote models.

Module-level `tf.layers`, a `tf.contrib.data` input pipeline, a
`tf.contrib.tpu.TPUEstimatorSpec` with a `(metric_fn, tensors)` tuple, a
`tf.contrib.summary` host_call and a `tf.contrib.tpu.CrossShardOptimizer`
wrapped unconditionally. `estimator_tpu.compat.tf` makes it run unchanged on
TF 2.15, on TPU or (use_tpu=False) on CPU.

Records: `image/encoded` (JPEG bytes) and `image/class/label` (int64,
1-based on disk).
"""

from estimator_tpu.compat import tf

IMAGE_SIZE = 32
# At 0.05 the first steps sometimes pushed bn2's beta so negative that every
# ReLU after it died (loss stuck at ln 10); 0.02 trains in 300 steps every time.
DEFAULT_LEARNING_RATE = 0.02
MOMENTUM = 0.9
# Labels are stored 1-based on disk (tensorflow/tpu's imagenet convention).
LABEL_OFFSET = 1
SHUFFLE_BUFFER = 1024
# tensorflow/tpu resnet's values: moving statistics that keep up with a short run.
BATCH_NORM_DECAY = 0.9
BATCH_NORM_EPSILON = 1e-5


def preprocess_image(image_bytes, image_size=IMAGE_SIZE):
  """Decodes one JPEG into float32 [image_size, image_size, 3] in [0, 1]."""
  image = tf.image.decode_jpeg(image_bytes, channels=3)
  image = tf.image.convert_image_dtype(image, tf.float32)
  image = tf.image.resize_images(image, [image_size, image_size])
  image.set_shape([image_size, image_size, 3])
  return image


def make_input_fn(pattern, mode, image_size=IMAGE_SIZE):
  """Returns input_fn(params) reading TFRecords that match `pattern`.

  Args:
    pattern: file glob, e.g. '/data/train-*'.
    mode: a tf.estimator.ModeKeys; TRAIN shuffles and repeats forever.
    image_size: side of the square images fed to the model.

  Returns:
    input_fn(params) -> Dataset of (images [batch, size, size, 3] float32,
    labels [batch] int32, 0-based), batch = params['batch_size'].
  """
  is_training = mode == tf.estimator.ModeKeys.TRAIN

  def parser(serialized):
    parsed = tf.parse_single_example(serialized, {
        "image/encoded": tf.FixedLenFeature((), tf.string, ""),
        "image/class/label": tf.FixedLenFeature([], tf.int64, -1),
    })
    image = preprocess_image(parsed["image/encoded"], image_size)
    label = tf.cast(parsed["image/class/label"], tf.int32) - LABEL_OFFSET
    return image, label

  def input_fn(params):
    files = tf.data.Dataset.list_files(pattern, shuffle=is_training)
    dataset = files.apply(tf.contrib.data.parallel_interleave(
        tf.data.TFRecordDataset, cycle_length=4, sloppy=is_training))
    if is_training:
      dataset = dataset.apply(
          tf.contrib.data.shuffle_and_repeat(SHUFFLE_BUFFER))
    # XLA needs static shapes: every batch is full.
    dataset = dataset.apply(tf.contrib.data.map_and_batch(
        parser, batch_size=params["batch_size"], num_parallel_batches=2,
        drop_remainder=True))
    return dataset.prefetch(tf.contrib.data.AUTOTUNE)

  return input_fn


def serving_input_receiver_fn(image_size=IMAGE_SIZE):
  """Serving input: `image_bytes`, a [batch] string tensor of JPEGs."""
  image_bytes = tf.placeholder(tf.string, [None], name="image_bytes")
  images = tf.map_fn(lambda b: preprocess_image(b, image_size), image_bytes,
                     dtype=tf.float32, back_prop=False)
  return tf.estimator.export.TensorServingInputReceiver(
      images, {"image_bytes": image_bytes})


def network(images, is_training, num_classes):
  """Two conv/batch-norm/relu/pool blocks and a dense layer.

  Args:
    images: float32 [batch, height, width, 3].
    is_training: Python bool (batch-norm mode).
    num_classes: number of logits.

  Returns:
    logits, float32 [batch, num_classes].
  """
  net = images
  for i, filters in enumerate([16, 32], start=1):
    net = tf.layers.conv2d(net, filters, 3, padding="same", use_bias=False,
                           name=f"conv{i}")
    net = tf.layers.batch_normalization(
        net, momentum=BATCH_NORM_DECAY, epsilon=BATCH_NORM_EPSILON,
        training=is_training, name=f"bn{i}")
    net = tf.nn.relu(net)
    net = tf.layers.max_pooling2d(net, 2, 2, name=f"pool{i}")
  net = tf.layers.flatten(net)
  return tf.layers.dense(net, num_classes, name="logits")


def _unpack_features(features):
  """(images, weights or None) from an image tensor or {'image', 'weight'}."""
  if isinstance(features, dict):
    return features["image"], features.get("weight")
  return features, None


def model_fn(features, labels, mode, params):
  """TPUEstimator model_fn: a digits classifier.

  Args:
    features: float32 images [batch, height, width, 3], or a dict with
      'image' (that tensor) and optional 'weight' (float [batch], 0 for
      padding examples).
    labels: int32 [batch], 0-based (None in PREDICT).
    mode: a tf.estimator.ModeKeys.
    params: dict with 'num_label_classes', 'use_tpu', 'batch_size', and
      optionally 'learning_rate' and 'model_dir' (enables the host_call).

  Returns:
    A tf.contrib.tpu.TPUEstimatorSpec.
  """
  images, weights = _unpack_features(features)
  num_classes = params["num_label_classes"]
  logits = network(tf.cast(images, tf.float32),
                   mode == tf.estimator.ModeKeys.TRAIN, num_classes)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return _predict_spec(logits)
  if weights is None:
    weights = tf.ones_like(labels, dtype=tf.float32)
  loss = tf.losses.softmax_cross_entropy(
      onehot_labels=tf.one_hot(labels, num_classes), logits=logits,
      weights=weights)
  if mode == tf.estimator.ModeKeys.TRAIN:
    return _train_spec(loss, params)
  return tf.contrib.tpu.TPUEstimatorSpec(
      mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits, weights]))


def metric_fn(labels, logits, weights):
  """Runs on the host: accuracy of argmax(logits), padding weighted out."""
  predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
  return {"accuracy": tf.metrics.accuracy(labels, predictions, weights=weights)}


def _predict_spec(logits):
  predictions = {
      "classes": tf.argmax(logits, axis=1),
      "probabilities": tf.nn.softmax(logits),
  }
  return tf.contrib.tpu.TPUEstimatorSpec(
      mode=tf.estimator.ModeKeys.PREDICT, predictions=predictions,
      export_outputs={"classify": tf.estimator.export.PredictOutput(
          predictions)})


def _train_spec(loss, params):
  """Momentum SGD behind a CrossShardOptimizer (a no-op wrapper off TPU)."""
  learning_rate = params.get("learning_rate", DEFAULT_LEARNING_RATE)
  global_step = tf.train.get_global_step()
  optimizer = tf.train.MomentumOptimizer(learning_rate, momentum=MOMENTUM)
  optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
  # Batch-norm moving averages update with each step.
  with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, global_step)
  host_call = None
  if params.get("model_dir"):
    host_call = (_make_host_call_fn(params["model_dir"]), [
        tf.reshape(global_step, [1]), tf.reshape(loss, [1]),
        tf.reshape(tf.cast(learning_rate, tf.float32), [1])])
  return tf.contrib.tpu.TPUEstimatorSpec(
      mode=tf.estimator.ModeKeys.TRAIN, loss=loss, train_op=train_op,
      host_call=host_call)


def _make_host_call_fn(model_dir):
  """tensorflow/tpu resnet's host_call: summaries written on the host."""
  def host_call_fn(global_step, loss, learning_rate):
    step = global_step[0]
    with tf.contrib.summary.create_file_writer(model_dir).as_default():
      with tf.contrib.summary.always_record_summaries():
        tf.contrib.summary.scalar("host_loss", loss[0], step=step)
        tf.contrib.summary.scalar("learning_rate", learning_rate[0], step=step)
        return tf.contrib.summary.all_summary_ops()
  return host_call_fn
