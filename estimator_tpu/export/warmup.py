"""TF Serving warm-up requests: PredictRequests of real JPEG bytes in assets.extra/.

The images are drawn here (smooth colour fields of several sizes, encoded
as JPEG), so an export needs no data set and no package beyond TensorFlow.
"""

import os

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

from estimator_tpu.export import contract

WARMUP_BATCH_SIZES = (1, 8)
# Sides of the drawn images, as multiples of the model's image size.
_SIZE_FACTORS = (0.5, 1.0, 1.5, 2.0)


def make_predict_request(image_bytes_list, model_name="", signature=contract.SERVING_SIGNATURE):
  """A gRPC PredictRequest feeding encoded images to `image_bytes`.

  Args:
    image_bytes_list: encoded images (bytes), one per batch row.
    model_name: the model's name on the server ('' in warm-up records,
      where TF Serving ignores it).
    signature: the signature to run.

  Returns:
    A predict_pb2.PredictRequest with inputs['image_bytes'] string [batch].
  """
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  request.inputs[contract.IMAGE_BYTES].CopyFrom(tf.make_tensor_proto(
      list(image_bytes_list), dtype=tf.string, shape=[len(image_bytes_list)]))
  return request


def warmup_images(image_size):
  """Eight JPEGs of four sizes around image_size: smooth random colour fields.

  Returns:
    A list of max(WARMUP_BATCH_SIZES) JPEG byte strings.
  """
  rng = np.random.default_rng(0)
  images = []
  for i in range(max(WARMUP_BATCH_SIZES)):
    side = max(8, int(image_size * _SIZE_FACTORS[i % len(_SIZE_FACTORS)]))
    corners = rng.uniform(0, 255, size=(2, 2, 3)).astype(np.float32)
    field = tf.image.resize(corners[None], (side, side), method="bilinear")[0]
    noise = rng.normal(0, 8, size=(side, side, 3))
    pixels = np.clip(field.numpy() + noise, 0, 255).astype(np.uint8)
    images.append(tf.io.encode_jpeg(pixels, quality=90).numpy())
  return images


def write_warmup_requests(version_dir, image_size, batch_sizes=WARMUP_BATCH_SIZES):
  """Writes assets.extra/tf_serving_warmup_requests: one PredictionLog per batch size.

  TF Serving replays these when it loads the version, so the first real
  request does not pay for graph and kernel initialization.

  Returns:
    The path of the written file.
  """
  images = warmup_images(image_size)
  directory = os.path.join(version_dir, contract.ASSETS_EXTRA)
  tf.io.gfile.makedirs(directory)
  path = os.path.join(directory, contract.WARMUP_FILE)
  with tf.io.TFRecordWriter(path) as writer:
    for batch_size in batch_sizes:
      log = prediction_log_pb2.PredictionLog(
          predict_log=prediction_log_pb2.PredictLog(
              request=make_predict_request(images[:batch_size])))
      writer.write(log.SerializeToString())
  return path
