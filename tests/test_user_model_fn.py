"""train.py/export.py --model_fn: a user's own model_fn in our loop, eval and export."""

import json
import os

from absl import flags
from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
import numpy as np
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu.cli import export
from estimator_tpu.cli import train
from estimator_tpu.data import digits
from estimator_tpu.model import user_model_fn

LEGACY = "examples.legacy_tpu_model.model:model_fn"


def _flags(program, *args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values([program, *args])
  return flag_values


def test_legacy_example_model_fn_trains_evaluates_exactly_and_exports(tmp_path, digits_dir):
  model_dir, export_dir = str(tmp_path / "m"), str(tmp_path / "e")
  assert train.run(_flags(
      "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
      f"--model_fn={LEGACY}", "--hparams=learning_rate=0.02", f"--image_size={IMAGE_SIZE}",
      "--train_steps=6", "--steps_per_eval=3", "--train_batch_size=8",
      "--eval_batch_size=8", "--norandom_flip")) == 0
  with open(os.path.join(model_dir, "eval_history.jsonl")) as f:
    history = [json.loads(line) for line in f]
  assert [h["step"] for h in history] == [3, 6]
  assert all(h["num_eval_examples"] == NUM_EVAL for h in history)
  saved = config_lib.read_config(model_dir)
  assert saved.model.model_fn == LEGACY
  assert saved.to_params()["learning_rate"] == 0.02

  assert export.run(_flags("export.py", f"--model_dir={model_dir}",
                           f"--export_dir={export_dir}")) == 0
  version = max(os.listdir(export_dir), key=int)
  signature = tf.saved_model.load(os.path.join(export_dir, version)).signatures[
      "serving_default"]
  images, _ = digits.digit_arrays(limit=3)
  outputs = signature(image_bytes=tf.constant([digits.encode_jpeg(i) for i in images]))
  probabilities = outputs["probabilities"].numpy()
  assert probabilities.shape == (3, 10)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_count_is_added_to_dict_style_metric_tensors():
  calls = {}

  def metric_fn(labels, logits):
    calls["args"] = (labels, logits)
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))}

  graph = tf.Graph()
  with graph.as_default():
    labels = tf.constant([0, 1, 1])
    logits = tf.constant([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    weights = tf.constant([1.0, 1.0, 0.0])
    fn, tensors = user_model_fn._count_metric_fn(
        metric_fn, {"labels": labels, "logits": logits}, weights)
    result = fn(**tensors)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      session.run([op for _, op in result.values()])
      values = session.run({k: v for k, (v, _) in result.items()})
  assert values["num_eval_examples"] == 2.0
  assert "accuracy" in values and calls["args"][0] is labels


def test_bad_model_fn_spec_names_the_flag(tmp_path, digits_dir, capsys):
  for spec, expected in (("nocolon", "must look like package.module:function"),
                         ("no_such_module_xyz:fn", "cannot import no_such_module_xyz"),
                         ("examples.legacy_tpu_model.model:nothing", "has no function nothing")):
    assert train.run(_flags("train.py", f"--data_dir={digits_dir}",
                            f"--model_dir={tmp_path}/m", f"--model_fn={spec}",
                            f"--image_size={IMAGE_SIZE}")) == 2
    err = capsys.readouterr().err
    assert f"--model_fn={spec}" in err and expected in err
