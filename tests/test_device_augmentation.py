"""--augment_on=device: the host feeds bfloat16 crops and draws; the model_fn applies them."""

from absl import flags
from conftest import IMAGE_SIZE
import numpy as np
import pytest
import tensorflow as tf

import estimator_tpu
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import stacks
from estimator_tpu.cli import train
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.model import device_augmentation
from estimator_tpu.run import curves

ModeKeys = stacks.ModeKeys


def _ramps(batch=6, height=8, width=12):
  """uint8 [batch, height, width, 3]: left-to-right ramps, a different one per image."""
  ramp = np.linspace(40, 200, width)[None, :, None] + np.arange(3)[None, None, :] * 10
  images = np.stack([np.broadcast_to(ramp + 5 * i, (height, width, 3)) for i in range(batch)])
  return images.astype(np.uint8)


def _draws(batch=6):
  flips = np.arange(batch) % 2
  deltas = np.linspace(-30.0, 30.0, batch)
  factors = np.linspace(0.8, 1.2, batch)
  return np.stack([flips, deltas, factors], axis=1).astype(np.float32)


def test_apply_augmentation_matches_the_per_image_ops_in_both_layouts():
  images, draws = _ramps(), _draws()
  out = image_ops.apply_augmentation(tf.constant(images), tf.constant(draws)).numpy()
  assert out.shape == images.shape and out.dtype == np.float32
  for i in range(len(images)):
    image = tf.image.flip_left_right(images[i]) if draws[i, 0] else tf.constant(images[i])
    image = tf.cast(image, tf.float32) / 255.0
    image = tf.image.adjust_contrast(tf.image.adjust_brightness(image, draws[i, 1] / 255.0),
                                     draws[i, 2])
    expected = image_ops.normalize(tf.clip_by_value(image, 0.0, 1.0) * 255.0).numpy()
    np.testing.assert_allclose(out[i], expected, atol=2e-4)
  hwcn = image_ops.apply_augmentation(
      input_pipeline.transpose_to_hwcn(tf.constant(images)), tf.constant(draws), hwcn=True)
  np.testing.assert_allclose(input_pipeline.transpose_from_hwcn(hwcn).numpy(), out, atol=1e-5)


def test_bfloat16_holds_every_pixel_value_exactly():
  values = np.arange(256, dtype=np.float32)
  assert np.array_equal(tf.cast(tf.cast(values, tf.bfloat16), tf.float32).numpy(), values)


def test_draws_follow_the_flip_setting():
  with_flips = image_ops.draw_augmentation(2000, random_flip=True, seed=5).numpy()
  without = image_ops.draw_augmentation(2000, random_flip=False, seed=5).numpy()
  assert with_flips.shape == (2000, 3) and with_flips.dtype == np.float32
  assert set(np.unique(with_flips[:, 0])) == {0.0, 1.0}
  assert 0.45 < with_flips[:, 0].mean() < 0.55
  assert not without[:, 0].any()
  limit = image_ops.BRIGHTNESS_DELTA * 255.0
  assert -limit <= with_flips[:, 1].min() < -0.9 * limit < 0.9 * limit < with_flips[:, 1].max()
  assert 0.8 <= with_flips[:, 2].min() < 0.82 and 1.18 < with_flips[:, 2].max() <= 1.2


def _device_batch(digits_dir, transpose=False, cache=False):
  input_fn = input_pipeline.make_input_fn(f"{digits_dir}/train-*", True, IMAGE_SIZE, seed=3,
                                          cache=cache, transpose_input=transpose,
                                          augment_on_device=True)
  return next(iter(input_fn({"batch_size": 8})))


@pytest.mark.parametrize("cache", [False, True])
def test_device_input_feeds_whole_bfloat16_pixels_and_draws(digits_dir, cache):
  features, labels = _device_batch(digits_dir, cache=cache)
  assert sorted(features) == [schema.AUGMENTATION_KEY, schema.IMAGE_KEY]
  images = features[schema.IMAGE_KEY]
  assert images.dtype == tf.bfloat16 and images.shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
  pixels = tf.cast(images, tf.float32).numpy()
  assert np.array_equal(pixels, np.round(pixels)) and 0 <= pixels.min() and pixels.max() <= 255
  assert pixels.std() > 10  # digits, not blank
  assert features[schema.AUGMENTATION_KEY].shape == (8, 3)
  assert labels.shape == (8,)


def test_params_choose_the_device_input_as_train_py_passes_it(digits_dir):
  input_fn = input_pipeline.make_input_fn(f"{digits_dir}/train-*", True, IMAGE_SIZE, seed=3)
  host, _ = next(iter(input_fn({"batch_size": 8})))
  device, _ = next(iter(input_fn({"batch_size": 8, "augment_on_device": True})))
  assert list(host) == [schema.IMAGE_KEY] and host[schema.IMAGE_KEY].dtype == tf.float32
  assert schema.AUGMENTATION_KEY in device


@pytest.mark.parametrize("transpose", [False, True])
def test_the_wrapper_gives_the_model_fn_what_the_host_would_have(digits_dir, transpose):
  features, labels = _device_batch(digits_dir, transpose)
  seen = {}

  def model_fn(features, labels, mode, params):
    seen.update(features)
    return "spec"

  wrapped = estimator_tpu.with_device_augmentation(model_fn)  # the public name
  params = {"transpose_input": transpose}
  assert wrapped(features, labels, ModeKeys.TRAIN, params, None) == "spec"
  assert list(seen) == [schema.IMAGE_KEY]
  images = features[schema.IMAGE_KEY]
  if transpose:
    images = input_pipeline.transpose_from_hwcn(images)
  # The host's XLA pass on the same uint8 pixels and draws.
  on_host = image_ops._apply_augmentation_compiled(
      tf.cast(tf.cast(images, tf.float32), tf.uint8), features[schema.AUGMENTATION_KEY])
  on_device = seen[schema.IMAGE_KEY]
  if transpose:
    on_device = input_pipeline.transpose_from_hwcn(on_device)
  assert on_device.dtype == tf.float32
  np.testing.assert_allclose(on_device.numpy(), on_host.numpy(), atol=1e-4)


def test_the_wrapper_passes_config_only_to_a_model_fn_that_names_it():
  calls = []

  def with_config(features, labels, mode, params, config):
    calls.append(("with", config))

  def without(features, mode, params):
    calls.append(("without", mode))

  wrap = device_augmentation.with_device_augmentation
  wrap(with_config)({}, None, ModeKeys.EVAL, {}, "run config")
  wrap(without)({}, None, ModeKeys.PREDICT, {}, "run config")
  assert calls == [("with", "run config"), ("without", ModeKeys.PREDICT)]


def test_draws_outside_training_are_an_error_naming_the_mode():
  features = {schema.IMAGE_KEY: tf.zeros([2, 4, 4, 3]),
              schema.AUGMENTATION_KEY: tf.zeros([2, 3])}
  with pytest.raises(ValueError, match="'augmentation' in eval mode"):
    device_augmentation.augment_features(features, ModeKeys.EVAL, {})


def test_auto_augments_on_the_device_only_on_tpu():
  runtime = config_lib.RuntimeConfig
  assert config_lib.augments_on_device(runtime(use_tpu=True))
  assert not config_lib.augments_on_device(runtime())
  assert config_lib.augments_on_device(runtime(augment_on="device"))
  assert not config_lib.augments_on_device(runtime(use_tpu=True, augment_on="host"))
  bad = config_lib.Config().replace("runtime", model_dir="m", augment_on="gpu")
  with pytest.raises(config_lib.ConfigError,
                     match="--augment_on=gpu is not one of auto, host, device"):
    bad.validate()


def test_train_py_trains_and_evaluates_with_augmentation_on_the_device(tmp_path, digits_dir,
                                                                       capsys):
  model_dir = str(tmp_path / "m")
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
               "--model=tiny", f"--image_size={IMAGE_SIZE}", "--train_batch_size=8",
               "--eval_batch_size=8", "--train_steps=4", "--steps_per_eval=4",
               "--transpose_input", "--augment_on=device", "--seed=1"])
  assert train.run(flag_values) == 0
  history = curves.read_history(model_dir)
  assert [h["step"] for h in history] == [4]
  assert history[0]["num_eval_examples"] == 37
  assert np.isfinite(history[0]["eval_loss"])

