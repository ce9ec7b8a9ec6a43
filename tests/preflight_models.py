"""User model_fns for preflight tests: --model_fn=tests.preflight_models:NAME."""

import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.model import model_fn as model_fn_lib


def rotating_model_fn(features, labels, mode, params):
  """Our model_fn behind a Keras RandomRotation layer: augmentation inside the model.

  RandomRotation runs ImageProjectiveTransformV3, which XLA cannot compile,
  so a TPU cannot run this model; preflight must say so.
  """
  rotate = stacks.keras.layers.RandomRotation(0.1, name="augment_rotation")
  images = rotate(features["image"], training=mode == stacks.ModeKeys.TRAIN)
  return model_fn_lib.model_fn(dict(features, image=images), labels, mode, params)


def callback_model_fn(features, labels, mode, params):
  """Our model_fn with a Python callback and a string op in its graph: neither runs on a TPU."""
  images = features["image"]
  images = tf.py_function(lambda x: x, [images], tf.float32, name="host_identity")
  images.set_shape(features["image"].shape)
  spec = model_fn_lib.model_fn(dict(features, image=images), labels, mode, params)
  message = tf.strings.format("loss {}", spec.loss, name="loss_message")
  with tf.control_dependencies([message]):
    return spec._replace(loss=tf.identity(spec.loss))


def eval_rotating_model_fn(features, labels, mode, params):
  """Rotates images in EVAL only (test-time augmentation): only the EVAL step has the op."""
  if mode == stacks.ModeKeys.EVAL:
    rotate = stacks.keras.layers.RandomRotation(0.1, name="eval_rotation")
    features = dict(features, image=rotate(features["image"], training=True))
  return model_fn_lib.model_fn(features, labels, mode, params)


def summary_model_fn(features, labels, mode, params):
  """Our model_fn plus a tf.compat.v1.summary.scalar inside it, which a TPU cannot write."""
  spec = model_fn_lib.model_fn(features, labels, mode, params)
  tf.compat.v1.summary.scalar("loss_in_model_fn", spec.loss)
  return spec


def complex128_model_fn(features, labels, mode, params):
  """Our model_fn with its logits passed through complex128, a dtype TPUs do not have."""
  spec = model_fn_lib.model_fn(features, labels, mode, params)
  as_complex = tf.cast(spec.loss, tf.complex128, name="loss_as_complex128")
  return spec._replace(loss=tf.cast(tf.math.real(as_complex), tf.float32))


# (mode, params['batch_size'], params['use_tpu'], images' batch, params['model_dir']) per call.
CALLS = []


def recording_model_fn(features, labels, mode, params):
  """Our model_fn, noting what each call was given in CALLS."""
  CALLS.append((mode, params["batch_size"], params["use_tpu"],
                tf.compat.dimension_value(features["image"].shape[0]), params["model_dir"]))
  return model_fn_lib.model_fn(features, labels, mode, params)
