"""The exporter: checkpoint -> SavedModel version dir with its signatures, warm-up and labels.

Serving runs the same preprocess_for_eval as evaluation, with the run's
central crop, so a served model sees exactly what evaluation saw; the
preprocessing signature tells clients that crop and size. The signatures, keys and files are
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
from estimator_tpu.export import versions
from estimator_tpu.export import warmup

# Staging directories are not numeric, so TF Serving never loads a half-written export.
_STAGING_PREFIX = "temp-staging-"


def decode_batch(image_bytes, image_size, central_fraction=contract.WHOLE_IMAGE,
                 crop_form=contract.OLD_CROP_FORM):
  """Decodes and preprocesses a batch of encoded images.

  Args:
    image_bytes: string tensor [batch] of JPEG/PNG/GIF/BMP bytes (any channels).
    image_size: side of the square output in pixels.
    central_fraction: the central part kept (the run's eval_crop).
    crop_form: image_ops.SQUARE or PER_SIDE (the run's eval_crop_form).

  Returns:
    float32 tensor [batch, image_size, image_size, 3], as preprocess_for_eval makes.

  Raises:
    tf.errors.InvalidArgumentError (when run): bytes that are no known image
    format ("Unknown image file format. One of JPEG, PNG, GIF, BMP required.").
  """
  # preprocess_for_eval holds no Python control flow on tensors: traced as written,
  # without AutoGraph's conversion (time, nothing else).
  return tf.map_fn(
      tf.autograph.experimental.do_not_convert(
          lambda b: image_ops.preprocess_for_eval(b, image_size, central_fraction, crop_form)),
      image_bytes, fn_output_signature=tf.float32)


def _preprocessing_outputs(image_bytes, image_size, central_fraction, crop_form):
  """{output key: tensor [batch]}: the preprocessing signature's constants, one row per input."""
  rows = tf.shape(image_bytes)[:1]
  return {contract.CENTRAL_FRACTION: tf.fill(
              rows, tf.constant(central_fraction, tf.float64), name=contract.CENTRAL_FRACTION),
          contract.IMAGE_SIZE: tf.fill(rows, image_size, name=contract.IMAGE_SIZE),
          contract.CROP_FORM: tf.fill(rows, tf.constant(crop_form), name=contract.CROP_FORM)}


def make_serving_input_receiver_fn(image_size, central_fraction=contract.WHOLE_IMAGE,
                                   preprocessing_outputs=None,
                                   crop_form=contract.OLD_CROP_FORM):
  """serving_input_receiver_fn for the serving_default and predict_images signatures.

  `images` is a placeholder_with_default over the decoded `image_bytes`:
  serving_default feeds the bytes and the default flows through, while the
  alternative receiver feeds `images` directly and skips decoding.

  Args:
    image_size: side of the square images the network takes.
    central_fraction: the central part serving_default keeps.
    preprocessing_outputs: a dict, or None; when given, filled with
      {output key: TensorInfo} of the preprocessing signature's outputs
      (constants in the exported graph) for add_preprocessing_signature.
    crop_form: image_ops.SQUARE or PER_SIDE: what central_fraction keeps.
  """

  def serving_input_receiver_fn():
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=contract.IMAGE_BYTES)
    images = tf.compat.v1.placeholder_with_default(
        decode_batch(image_bytes, image_size, central_fraction, crop_form),
        [None, image_size, image_size, 3], name=contract.IMAGES)
    if preprocessing_outputs is not None:
      outputs = _preprocessing_outputs(image_bytes, image_size, central_fraction, crop_form)
      preprocessing_outputs.update(
          {key: tf.compat.v1.saved_model.utils.build_tensor_info(tensor)
           for key, tensor in outputs.items()})
    return stacks.estimator.export.ServingInputReceiver(
        {schema.IMAGE_KEY: images}, {contract.IMAGE_BYTES: image_bytes},
        receiver_tensors_alternatives={
            contract.PREDICT_IMAGES_SIGNATURE: {contract.IMAGES: images}})

  return serving_input_receiver_fn


def estimator_signature_name(receiver_name):
  """The key estimator gives an alternative receiver's signature: '<receiver>:<output key>'."""
  return f"{receiver_name}:{contract.SERVING_SIGNATURE}"


def _edit_signatures(version_dir, edit):
  """Runs edit(signature_def map, path) on each meta graph of version_dir/saved_model.pb."""
  path = os.path.join(version_dir, contract.SAVED_MODEL_FILE)
  saved_model = saved_model_pb2.SavedModel()
  with tf.io.gfile.GFile(path, "rb") as f:
    saved_model.ParseFromString(f.read())
  for meta_graph in saved_model.meta_graphs:
    edit(meta_graph.signature_def, path)
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(saved_model.SerializeToString())


def rename_signatures(version_dir, renames):
  """Renames SignatureDef keys in version_dir/saved_model.pb, in place.

  Args:
    version_dir: a SavedModel directory.
    renames: {old key: new key}.

  Raises:
    ValueError: a key in renames is not in the SavedModel.
  """

  def rename(signatures, path):
    for old, new in renames.items():
      if old not in signatures:
        raise ValueError(f"{path} has no signature {old!r}; it has {sorted(signatures)}")
      signatures[new].CopyFrom(signatures[old])
      del signatures[old]

  _edit_signatures(version_dir, rename)


def add_preprocessing_signature(version_dir, outputs):
  """Adds the preprocessing signature: serving_default's image_bytes in, outputs out.

  Args:
    version_dir: a SavedModel directory with a serving_default signature.
    outputs: {output key: TensorInfo} of tensors in its graph.
  """

  def add(signatures, path):
    serving = signatures[contract.SERVING_SIGNATURE]
    signature = signatures[contract.PREPROCESSING_SIGNATURE]
    signature.inputs[contract.IMAGE_BYTES].CopyFrom(serving.inputs[contract.IMAGE_BYTES])
    for key, info in outputs.items():
      signature.outputs[key].CopyFrom(info)
    signature.method_name = serving.method_name

  _edit_signatures(version_dir, add)


def _publish(staged_dir, export_dir):
  """Moves a finished version dir into export_dir under a free numeric name; returns it."""
  version = int(os.path.basename(staged_dir.rstrip("/")))
  while tf.io.gfile.exists(os.path.join(export_dir, str(version))):
    version += 1
  final = os.path.join(export_dir, str(version))
  tf.io.gfile.rename(staged_dir, final)
  return final


def export_saved_model(estimator, export_dir, image_size=None, checkpoint_path=None,
                       central_fraction=None, crop_form=None):
  """Exports the CPU/GPU graph under export_dir/<numeric version>/ and returns that path.

  The version is staged in a non-numeric directory, completed (signature
  renamed to `predict_images`, the preprocessing signature, warm-up
  requests, labels) and only then moved into place, so TF Serving never
  loads a partial export.

  Args:
    estimator: the (TPU)Estimator whose model_fn serves.
    export_dir: the base directory TF Serving watches.
    image_size: side of the square images the model takes; None: the
      estimator's params['image_size'] (the run's config).
    checkpoint_path: the checkpoint to export (None: the latest in model_dir).
    central_fraction: the central part serving_default keeps; None:
      params['eval_crop'] (the run's config; 1.0 when absent), so serving
      crops as evaluation did.
    crop_form: image_ops.SQUARE or PER_SIDE, what central_fraction keeps;
      None: params['eval_crop_form'] (the run's config; PER_SIDE when absent,
      as params from before the field meant).

  Returns:
    The version directory path (str).
  """
  image_size, central_fraction, crop_form = _serving_settings(
      estimator, image_size, central_fraction, crop_form)
  checkpoint_path = checkpoint_path or tf.train.latest_checkpoint(estimator.model_dir)
  staging = os.path.join(export_dir, _STAGING_PREFIX + uuid.uuid4().hex)
  preprocessing = {}
  try:
    staged = estimator.export_saved_model(
        staging, make_serving_input_receiver_fn(image_size, central_fraction, preprocessing,
                                                crop_form),
        checkpoint_path=checkpoint_path)
    staged = staged.decode() if isinstance(staged, bytes) else staged
    rename_signatures(staged, {
        estimator_signature_name(contract.PREDICT_IMAGES_SIGNATURE):
            contract.PREDICT_IMAGES_SIGNATURE})
    add_preprocessing_signature(staged, preprocessing)
    warmup.write_warmup_requests(staged, image_size)
    class_names = estimator.params.get("class_names")
    if class_names:
      contract.write_labels(staged, class_names)
    if checkpoint_path:
      versions.write_record(staged, _source_record(
          estimator, checkpoint_path, image_size, central_fraction, crop_form))
    return _publish(staged, export_dir)
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)


def _serving_settings(estimator, image_size, central_fraction, crop_form):
  """(image_size, central_fraction, crop_form), the run's params filling in what is None."""
  image_size = image_size or estimator.params["image_size"]
  if central_fraction is None:
    central_fraction = float(estimator.params.get("eval_crop", contract.WHOLE_IMAGE))
  if crop_form is None:
    crop_form = estimator.params.get("eval_crop_form", contract.OLD_CROP_FORM)
  return image_size, central_fraction, crop_form


def _source_record(estimator, checkpoint_path, image_size, central_fraction, crop_form):
  params = dict(estimator.params, image_size=image_size, eval_crop=central_fraction,
                eval_crop_form=crop_form)
  return versions.source_record(checkpoint_path, params)


def find_export(estimator, export_dir, checkpoint_path=None, image_size=None,
                central_fraction=None, crop_form=None):
  """The version dir under export_dir that already holds this export, or None.

  Same arguments as export_saved_model; the checkpoint is compared by content
  (export/versions.py), so a re-run publishes no identical version.
  """
  checkpoint_path = checkpoint_path or tf.train.latest_checkpoint(estimator.model_dir)
  if not checkpoint_path:
    return None
  settings = _serving_settings(estimator, image_size, central_fraction, crop_form)
  return versions.find(export_dir, _source_record(estimator, checkpoint_path, *settings))


def latest_export(export_dir):
  """The newest numeric version directory under export_dir, or None."""
  versions = [name.rstrip("/") for name in tf.io.gfile.listdir(export_dir)
              if name.rstrip("/").isdigit()] if tf.io.gfile.isdir(export_dir) else []
  return os.path.join(export_dir, max(versions, key=int)) if versions else None
