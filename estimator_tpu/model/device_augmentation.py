"""Training augmentation on the accelerator: a model_fn wrapper that applies the host's draws.

With --augment_on=device (the default with --use_tpu) the training input_fn
stops after crop and resize: it feeds bfloat16 pixel values and each image's
flip, brightness and contrast draws (schema.AUGMENTATION_KEY). The wrapper
applies them with image_ops.apply_augmentation, the same math the host runs
otherwise, at the start of the model_fn, so the model_fn it wraps (ours or a
user's) sees the float32 normalized images it always gets. Evaluation and
prediction features carry no draws and pass through untouched.
"""

from tensorflow.python.util import function_utils

from estimator_tpu import stacks
from estimator_tpu.data import image_ops
from estimator_tpu.data import schema


def augment_features(features, mode, params):
  """features with the draws applied to `image` and removed; others unchanged.

  Args:
    features: what the input_fn fed: a dict, or a tensor.
    mode: a stacks.ModeKeys value.
    params: the estimator's params (`transpose_input` gives the layout).

  Raises:
    ValueError: the draws arrive outside training.
  """
  if not isinstance(features, dict) or schema.AUGMENTATION_KEY not in features:
    return features
  if mode != stacks.ModeKeys.TRAIN:
    raise ValueError(f"features hold '{schema.AUGMENTATION_KEY}' in {mode} mode; only a "
                     "training input_fn augments")
  features = dict(features)
  augmentation = features.pop(schema.AUGMENTATION_KEY)
  features[schema.IMAGE_KEY] = image_ops.apply_augmentation(
      features[schema.IMAGE_KEY], augmentation, hwcn=bool(params.get("transpose_input")))
  return features


def with_device_augmentation(model_fn):
  """model_fn' that applies augment_features, then calls model_fn with the arguments it names.

  Wrapping twice is harmless: the inner wrapper finds no draws left.
  """
  named = set(function_utils.fn_args(model_fn))

  def augmenting_model_fn(features, labels, mode, params, config):
    given = {"labels": labels, "mode": mode, "params": params, "config": config}
    return model_fn(augment_features(features, mode, params),
                    **{name: value for name, value in given.items() if name in named})

  return augmenting_model_fn
