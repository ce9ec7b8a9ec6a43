"""The serving contract: input receiver, signature and tensor names, SavedModel export, warm-up.

Serving runs the same preprocess_for_eval as evaluation, so a served model
sees exactly what evaluation saw. An export holds two signatures:

  serving_default  inputs  image_bytes   string  [batch]  JPEG/PNG/GIF/BMP bytes
  predict_images   inputs  images        float32 [batch, image_size, image_size, 3]
                   already preprocessed: preprocessing.preprocess_for_eval's output
                   (RGB, bilinear antialiased resize, (x - MEAN_RGB) / STDDEV_RGB)
  both             outputs probabilities float32 [batch, num_classes]
                           classid       int32   [batch]
                           class         string  [batch]  (when class names are known)

and assets.extra/ with TF Serving's warm-up requests and the class names.
"""

import os
import uuid

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_log_pb2

from estimator_tpu import datasets
from estimator_tpu import input_pipeline
from estimator_tpu import model_fn as model_fn_lib
from estimator_tpu import preprocessing
from estimator_tpu import stacks

IMAGE_BYTES = "image_bytes"
IMAGES = "images"
PROBABILITIES = model_fn_lib.PROBABILITIES
CLASSID = model_fn_lib.CLASSID
CLASS = model_fn_lib.CLASS
OUTPUT_KEYS = (PROBABILITIES, CLASSID, CLASS)
SERVING_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
PREDICT_IMAGES_SIGNATURE = "predict_images"
SIGNATURE_INPUTS = {SERVING_SIGNATURE: IMAGE_BYTES, PREDICT_IMAGES_SIGNATURE: IMAGES}
SAVED_MODEL_FILE = "saved_model.pb"
ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
LABELS_FILE = "labels.txt"
WARMUP_BATCH_SIZES = (1, 8)
WARMUP_PHOTOS = ("china.jpg", "flower.jpg")
# Staging directories are not numeric, so TF Serving never loads a half-written export.
_STAGING_PREFIX = "temp-staging-"


def decode_batch(image_bytes, image_size):
  """Decodes and preprocesses a batch of encoded images.

  Args:
    image_bytes: string tensor [batch] of JPEG/PNG/GIF/BMP bytes (any channels).
    image_size: side of the square output in pixels.

  Returns:
    float32 tensor [batch, image_size, image_size, 3], as preprocess_for_eval makes.

  Raises:
    tf.errors.InvalidArgumentError (when run): bytes that are no known image
    format ("Unknown image file format. One of JPEG, PNG, GIF, BMP required.").
  """
  return tf.map_fn(lambda b: preprocessing.preprocess_for_eval(b, image_size),
                   image_bytes, fn_output_signature=tf.float32)


def make_serving_input_receiver_fn(image_size):
  """serving_input_receiver_fn for the serving_default and predict_images signatures.

  `images` is a placeholder_with_default over the decoded `image_bytes`:
  serving_default feeds the bytes and the default flows through, while the
  alternative receiver feeds `images` directly and skips decoding.
  """

  def serving_input_receiver_fn():
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=IMAGE_BYTES)
    images = tf.compat.v1.placeholder_with_default(
        decode_batch(image_bytes, image_size), [None, image_size, image_size, 3],
        name=IMAGES)
    return stacks.estimator.export.ServingInputReceiver(
        {input_pipeline.IMAGE_KEY: images}, {IMAGE_BYTES: image_bytes},
        receiver_tensors_alternatives={PREDICT_IMAGES_SIGNATURE: {IMAGES: images}})

  return serving_input_receiver_fn


def estimator_signature_name(receiver_name):
  """The key estimator gives an alternative receiver's signature: '<receiver>:<output key>'."""
  return f"{receiver_name}:{model_fn_lib.SERVING_KEY}"


def rename_signatures(version_dir, renames):
  """Renames SignatureDef keys in version_dir/saved_model.pb, in place.

  Args:
    version_dir: a SavedModel directory.
    renames: {old key: new key}.

  Raises:
    ValueError: a key in renames is not in the SavedModel.
  """
  path = os.path.join(version_dir, SAVED_MODEL_FILE)
  saved_model = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(path, "rb") as f:
    saved_model.ParseFromString(f.read())
  for meta_graph in saved_model.meta_graphs:
    signatures = meta_graph.signature_def
    for old, new in renames.items():
      if old not in signatures:
        raise ValueError(f"{path} has no signature {old!r}; it has {sorted(signatures)}")
      signatures[new].CopyFrom(signatures[old])
      del signatures[old]
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(saved_model.SerializeToString())


def make_predict_request(image_bytes_list, model_name="", signature=SERVING_SIGNATURE):
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
  request.inputs[IMAGE_BYTES].CopyFrom(tf.make_tensor_proto(
      list(image_bytes_list), dtype=tf.string, shape=[len(image_bytes_list)]))
  return request


def warmup_images(image_size):
  """Eight real JPEGs: scikit-learn's two sample photos, then digits.

  Returns:
    A list of 8 JPEG byte strings, of several sizes.
  """
  from sklearn.datasets import load_sample_image  # pylint: disable=g-import-not-at-top
  photos = [datasets.encode_jpeg(load_sample_image(name)) for name in WARMUP_PHOTOS]
  count = max(WARMUP_BATCH_SIZES) - len(photos)
  digits, _ = datasets.digit_arrays(limit=count, size=image_size)
  return photos + [datasets.encode_jpeg(digit) for digit in digits]


def write_warmup_requests(version_dir, image_size, batch_sizes=WARMUP_BATCH_SIZES):
  """Writes assets.extra/tf_serving_warmup_requests: one PredictionLog per batch size.

  TF Serving replays these when it loads the version, so the first real
  request does not pay for graph and kernel initialization.

  Returns:
    The path of the written file.
  """
  images = warmup_images(image_size)
  directory = os.path.join(version_dir, ASSETS_EXTRA)
  tf.io.gfile.makedirs(directory)
  path = os.path.join(directory, WARMUP_FILE)
  with tf.io.TFRecordWriter(path) as writer:
    for batch_size in batch_sizes:
      log = prediction_log_pb2.PredictionLog(
          predict_log=prediction_log_pb2.PredictLog(
              request=make_predict_request(images[:batch_size])))
      writer.write(log.SerializeToString())
  return path


def write_labels(version_dir, class_names):
  """Writes assets.extra/labels.txt: class names, one a line, in classid order."""
  directory = os.path.join(version_dir, ASSETS_EXTRA)
  tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(os.path.join(directory, LABELS_FILE), "w") as f:
    f.write("".join(f"{name}\n" for name in class_names))


def read_labels(version_dir):
  """The class names in version_dir/assets.extra/labels.txt, or None when absent."""
  path = os.path.join(version_dir, ASSETS_EXTRA, LABELS_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return [line.rstrip("\n") for line in f]


def _publish(staged_dir, export_dir):
  """Moves a finished version dir into export_dir under a free numeric name; returns it."""
  version = int(os.path.basename(staged_dir.rstrip("/")))
  while tf.io.gfile.exists(os.path.join(export_dir, str(version))):
    version += 1
  final = os.path.join(export_dir, str(version))
  tf.io.gfile.rename(staged_dir, final)
  return final


def export_saved_model(estimator, export_dir, image_size, checkpoint_path=None):
  """Exports the CPU/GPU graph under export_dir/<numeric version>/ and returns that path.

  The version is staged in a non-numeric directory, completed (signature
  renamed to `predict_images`, warm-up requests, labels) and only then moved
  into place, so TF Serving never loads a partial export.

  Args:
    estimator: the (TPU)Estimator whose model_fn serves.
    export_dir: the base directory TF Serving watches.
    image_size: side of the square images the model takes.
    checkpoint_path: the checkpoint to export (None: the latest in model_dir).

  Returns:
    The version directory path (str).
  """
  staging = os.path.join(export_dir, _STAGING_PREFIX + uuid.uuid4().hex)
  try:
    staged = estimator.export_saved_model(
        staging, make_serving_input_receiver_fn(image_size),
        checkpoint_path=checkpoint_path)
    staged = staged.decode() if isinstance(staged, bytes) else staged
    rename_signatures(staged, {
        estimator_signature_name(PREDICT_IMAGES_SIGNATURE): PREDICT_IMAGES_SIGNATURE})
    write_warmup_requests(staged, image_size)
    class_names = estimator.params.get("class_names")
    if class_names:
      write_labels(staged, class_names)
    return _publish(staged, export_dir)
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)


def latest_export(export_dir):
  """The newest numeric version directory under export_dir, or None."""
  versions = [name.rstrip("/") for name in tf.io.gfile.listdir(export_dir)
              if name.rstrip("/").isdigit()] if tf.io.gfile.isdir(export_dir) else []
  return os.path.join(export_dir, max(versions, key=int)) if versions else None
