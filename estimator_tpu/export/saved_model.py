"""The exporter: checkpoint -> SavedModel version dir with both signatures, warm-up and labels.

Serving runs the same preprocess_for_eval as evaluation, so a served model
sees exactly what evaluation saw. The signatures, keys and files are
export/contract.py's; the version is staged and published whole.
"""

import os
import uuid

import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from estimator_tpu import stacks
from estimator_tpu.data import image_ops
from estimator_tpu.data import schema
from estimator_tpu.export import contract
from estimator_tpu.export import warmup

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
  return tf.map_fn(lambda b: image_ops.preprocess_for_eval(b, image_size),
                   image_bytes, fn_output_signature=tf.float32)


def make_serving_input_receiver_fn(image_size):
  """serving_input_receiver_fn for the serving_default and predict_images signatures.

  `images` is a placeholder_with_default over the decoded `image_bytes`:
  serving_default feeds the bytes and the default flows through, while the
  alternative receiver feeds `images` directly and skips decoding.
  """

  def serving_input_receiver_fn():
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=contract.IMAGE_BYTES)
    images = tf.compat.v1.placeholder_with_default(
        decode_batch(image_bytes, image_size), [None, image_size, image_size, 3],
        name=contract.IMAGES)
    return stacks.estimator.export.ServingInputReceiver(
        {schema.IMAGE_KEY: images}, {contract.IMAGE_BYTES: image_bytes},
        receiver_tensors_alternatives={
            contract.PREDICT_IMAGES_SIGNATURE: {contract.IMAGES: images}})

  return serving_input_receiver_fn


def estimator_signature_name(receiver_name):
  """The key estimator gives an alternative receiver's signature: '<receiver>:<output key>'."""
  return f"{receiver_name}:{contract.SERVING_SIGNATURE}"


def rename_signatures(version_dir, renames):
  """Renames SignatureDef keys in version_dir/saved_model.pb, in place.

  Args:
    version_dir: a SavedModel directory.
    renames: {old key: new key}.

  Raises:
    ValueError: a key in renames is not in the SavedModel.
  """
  path = os.path.join(version_dir, contract.SAVED_MODEL_FILE)
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


def _publish(staged_dir, export_dir):
  """Moves a finished version dir into export_dir under a free numeric name; returns it."""
  version = int(os.path.basename(staged_dir.rstrip("/")))
  while tf.io.gfile.exists(os.path.join(export_dir, str(version))):
    version += 1
  final = os.path.join(export_dir, str(version))
  tf.io.gfile.rename(staged_dir, final)
  return final


def export_saved_model(estimator, export_dir, image_size=None, checkpoint_path=None):
  """Exports the CPU/GPU graph under export_dir/<numeric version>/ and returns that path.

  The version is staged in a non-numeric directory, completed (signature
  renamed to `predict_images`, warm-up requests, labels) and only then moved
  into place, so TF Serving never loads a partial export.

  Args:
    estimator: the (TPU)Estimator whose model_fn serves.
    export_dir: the base directory TF Serving watches.
    image_size: side of the square images the model takes; None: the
      estimator's params['image_size'] (the run's config).
    checkpoint_path: the checkpoint to export (None: the latest in model_dir).

  Returns:
    The version directory path (str).
  """
  image_size = image_size or estimator.params["image_size"]
  staging = os.path.join(export_dir, _STAGING_PREFIX + uuid.uuid4().hex)
  try:
    staged = estimator.export_saved_model(
        staging, make_serving_input_receiver_fn(image_size),
        checkpoint_path=checkpoint_path)
    staged = staged.decode() if isinstance(staged, bytes) else staged
    rename_signatures(staged, {
        estimator_signature_name(contract.PREDICT_IMAGES_SIGNATURE):
            contract.PREDICT_IMAGES_SIGNATURE})
    warmup.write_warmup_requests(staged, image_size)
    class_names = estimator.params.get("class_names")
    if class_names:
      contract.write_labels(staged, class_names)
    return _publish(staged, export_dir)
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)


def latest_export(export_dir):
  """The newest numeric version directory under export_dir, or None."""
  versions = [name.rstrip("/") for name in tf.io.gfile.listdir(export_dir)
              if name.rstrip("/").isdigit()] if tf.io.gfile.isdir(export_dir) else []
  return os.path.join(export_dir, max(versions, key=int)) if versions else None
