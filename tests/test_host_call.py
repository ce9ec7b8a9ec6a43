"""host_call summaries: after a CPU run, model_dir's event files hold them for every step."""

import collections
import glob
import os

import numpy as np
import tensorflow as tf

from estimator_tpu import config as config_lib

TAGS = ("train/loss", "train/learning_rate", "train/accuracy", "train/examples_per_sec")


def _scalars(paths):
  """{tag: {step: value}} from TF event files."""
  values = collections.defaultdict(dict)
  for path in paths:
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (float(tf.make_ndarray(value.tensor)) if value.HasField("tensor")
                  else value.simple_value)
        values[value.tag][event.step] = number
  return values


def test_host_call_writes_every_step_with_plausible_values(trained_model_dir):
  # The fixture trained 4 steps of 8 examples (train.py, TPUEstimator on CPU).
  host_files = glob.glob(os.path.join(trained_model_dir, "events.out.tfevents.*.v2"))
  summaries = _scalars(host_files)
  steps = [0, 1, 2, 3]  # the global step each training step started from
  for tag in TAGS:
    assert sorted(summaries[tag]) == steps, tag

  params = config_lib.read_config(trained_model_dir).to_params()
  learning_rates = [summaries["train/learning_rate"][s] for s in steps]
  # The cosine schedule by hand: peak = base x 8 / 256, no warm-up, 4 steps.
  peak = params["base_learning_rate"] * 8 / 256
  assert params["warmup_steps"] == 0 and params["train_steps"] == 4
  np.testing.assert_allclose(learning_rates, [peak, peak * (2 + 2 ** 0.5) / 4, peak / 2,
                                              peak * (2 - 2 ** 0.5) / 4], rtol=1e-5)

  losses = [summaries["train/loss"][s] for s in steps]
  assert all(0.5 < loss < 10 for loss in losses)  # 10 classes: about ln(10) = 2.3 at first
  # Accuracy of one batch of 8: a whole number of eighths.
  eighths = [summaries["train/accuracy"][s] * 8 for s in steps]
  assert all(abs(e - round(e)) < 1e-5 and 0 <= round(e) <= 8 for e in eighths), eighths
  rates = [summaries["train/examples_per_sec"][s] for s in steps]
  assert rates[0] == 0 and all(rate > 0 for rate in rates[1:])  # no previous step to time


def test_host_call_loss_is_the_loss_the_estimator_logs(trained_model_dir):
  estimator_files = [path for path in glob.glob(
      os.path.join(trained_model_dir, "events.out.tfevents.*")) if not path.endswith(".v2")]
  logged = _scalars(estimator_files)["loss"]  # written after the step: global step + 1
  host_call = _scalars(glob.glob(os.path.join(trained_model_dir, "*.v2")))["train/loss"]
  assert logged
  for step, loss in logged.items():
    assert host_call[step - 1] == np.float32(loss)


def test_summaries_every_n_steps_write_only_those_steps(digits_dir, tmp_path):
  from absl import flags

  from estimator_tpu import flags as flags_lib
  from estimator_tpu.cli import train
  from estimator_tpu.engines import choose as tpu_estimator
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", f"--data_dir={digits_dir}", f"--model_dir={tmp_path}",
               "--model=tiny", "--image_size=32", "--train_steps=6", "--steps_per_eval=6",
               "--train_batch_size=8", "--eval_batch_size=8", "--norandom_flip",
               "--summary_every_n_steps=3"])
  assert train.run(flag_values) == 0
  summaries = _scalars(glob.glob(os.path.join(str(tmp_path), "events.out.tfevents.*.v2")))
  for tag in TAGS:
    assert sorted(summaries[tag]) == [0, 3], tag
  config = config_lib.read_config(str(tmp_path))
  run_config = tpu_estimator.build_run_config(config)
  assert run_config.tpu_config.experimental_host_call_every_n_steps == 3  # the TPU outfeed too
