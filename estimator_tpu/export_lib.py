"""The serving contract: input receiver, signature and tensor names, SavedModel export.

Serving runs the same preprocess_for_eval as evaluation, so a served model
sees exactly what evaluation saw.
"""

import os

import tensorflow as tf

from estimator_tpu import input_pipeline
from estimator_tpu import model_fn as model_fn_lib
from estimator_tpu import preprocessing

IMAGE_BYTES = "image_bytes"
PROBABILITIES = model_fn_lib.PROBABILITIES
CLASSID = model_fn_lib.CLASSID
CLASS = model_fn_lib.CLASS
SERVING_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY


def decode_batch(image_bytes, image_size):
  """[batch] encoded images -> [batch, image_size, image_size, 3] float32."""
  return tf.map_fn(lambda b: preprocessing.preprocess_for_eval(b, image_size),
                   image_bytes, fn_output_signature=tf.float32)


def make_serving_input_receiver_fn(image_size):
  """serving_input_receiver_fn taking `image_bytes`: a [None] batch of JPEG/PNG strings."""

  def serving_input_receiver_fn():
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name=IMAGE_BYTES)
    images = decode_batch(image_bytes, image_size)
    return tf.estimator.export.ServingInputReceiver(
        {input_pipeline.IMAGE_KEY: images}, {IMAGE_BYTES: image_bytes})

  return serving_input_receiver_fn


def export_saved_model(estimator, export_dir, image_size, checkpoint_path=None):
  """Exports the CPU/GPU graph under export_dir/<numeric version>/; returns that path."""
  path = estimator.export_saved_model(
      export_dir, make_serving_input_receiver_fn(image_size),
      checkpoint_path=checkpoint_path)
  return path.decode() if isinstance(path, bytes) else path


def latest_export(export_dir):
  """The newest numeric version directory under export_dir, or None."""
  versions = [name.rstrip("/") for name in tf.io.gfile.listdir(export_dir)
              if name.rstrip("/").isdigit()] if tf.io.gfile.isdir(export_dir) else []
  return os.path.join(export_dir, max(versions, key=int)) if versions else None
