"""Shared fixtures: small real-JPEG data sets and a briefly trained model, written once per session."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from estimator_tpu import config as config_lib  # pylint: disable=wrong-import-position
from estimator_tpu import testing  # pylint: disable=wrong-import-position

NUM_TRAIN = 200
NUM_EVAL = 37
IMAGE_SIZE = 32


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
  """preprocess.py's layout: 200 train and 37 validation 32x32 digit JPEGs, 10 classes."""
  return testing.write_digits_dataset(str(tmp_path_factory.mktemp("digits")),
                                      num_train=NUM_TRAIN, num_eval=NUM_EVAL,
                                      size=IMAGE_SIZE)


def tiny_config(model_dir, **train):
  """A validated Config for the tiny network on the digits fixture (10 classes)."""
  settings = dict(train_steps=2, steps_per_eval=2, train_batch_size=8,
                  eval_batch_size=8, seed=1)
  settings.update(train)
  return (config_lib.Config()
          .replace("data", image_size=IMAGE_SIZE, num_label_classes=10,
                   class_names=tuple(str(i) for i in range(10)),
                   num_eval_examples=NUM_EVAL, random_flip=False)
          .replace("model", model="tiny", dropout_rate=0.0)
          .replace("train", **settings)
          .replace("runtime", model_dir=str(model_dir), iterations_per_loop=2)
          .validate())


@pytest.fixture(scope="session")
def trained_model_dir(tmp_path_factory, digits_dir):
  """A model_dir where train.py trained the tiny network 4 steps, with config.json."""
  import train  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from estimator_tpu import flags as flags_lib  # pylint: disable=g-import-not-at-top
  model_dir = str(tmp_path_factory.mktemp("trained"))
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values([
      "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
      "--model=tiny", f"--image_size={IMAGE_SIZE}", "--train_steps=4",
      "--steps_per_eval=4", "--train_batch_size=8", "--eval_batch_size=8",
      "--norandom_flip", "--seed=1"])
  assert train.run(flag_values) == 0
  return model_dir


@pytest.fixture(scope="session")
def exported_model(tmp_path_factory, trained_model_dir):
  """The SavedModel version dir export.py writes for trained_model_dir (both signatures, warm-up)."""
  from estimator_tpu import export_lib  # pylint: disable=g-import-not-at-top
  from estimator_tpu import runner  # pylint: disable=g-import-not-at-top
  export_dir = str(tmp_path_factory.mktemp("export"))
  config, checkpoint = runner.prepare_export(trained_model_dir, export_dir)
  return export_lib.export_saved_model(runner.build(config), export_dir,
                                       config.data.image_size, checkpoint_path=checkpoint)
