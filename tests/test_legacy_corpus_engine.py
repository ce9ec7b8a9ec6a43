"""examples/legacy_corpus's TPUEstimator programs on the distribute and JAX engines, unedited.

Each program runs as in tests/test_legacy_corpus.py, with ESTIMATOR_TPU_ENGINE=distribute
(or =jax) in its environment: its `TPUEstimator(...)` is then the engine, which
says so in the program's first line of output.
"""

import json
import os
import sys

from conftest import program_env
import contract_programs
import numpy as np
import programs
import pytest
import tensorflow as tf
from test_legacy_corpus import BERT_CONFIG
from test_legacy_corpus import CORPUS
from test_legacy_corpus import INIT_VALUE
from test_legacy_corpus import REPO
from test_legacy_corpus import _results
from test_legacy_corpus import _steps
from test_legacy_corpus import _write_init_checkpoint

ENGINE_LINES = {
    "distribute": "[estimator_tpu] engine: distribute (OneDeviceStrategy, 1 replica), from "
                  "ESTIMATOR_TPU_ENGINE",
    "jax": "[estimator_tpu] engine: jax (1 cpu device), from ESTIMATOR_TPU_ENGINE"}
ENGINE_LINE = ENGINE_LINES["distribute"]


ENGINES = ["distribute", pytest.param("jax", marks=pytest.mark.skipif(
    not contract_programs.HAS_JAX, reason=contract_programs.NO_JAX))]


@pytest.fixture(params=ENGINES)
def engine(request):
  return request.param


def _run(engine, program, *args):
  """Runs a corpus program on engine (ESTIMATOR_TPU_ENGINE); returns its stdout."""
  done = programs.run(
      [sys.executable, os.path.join(CORPUS, program), *args], cwd=REPO,
      capture_output=True, text=True, timeout=300,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_ENGINE=engine,
                      XLA_FLAGS="--xla_force_host_platform_device_count=1"))
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
  assert done.stdout.splitlines()[0] == ENGINE_LINES[engine], done.stdout[:500]
  return done.stdout


def _serve(export_dir):
  (version,) = os.listdir(export_dir)
  return tf.saved_model.load(os.path.join(export_dir, version))


@pytest.mark.slow
def test_mnist_like_trains_evaluates_predicts_and_exports(engine, tmp_path):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  _run(engine, "mnist_like/mnist_tpu.py", f"--model_dir={model_dir}",
       f"--export_dir={export_dir}",
       "--train_steps=40")
  results = _results(os.path.join(model_dir, "eval_results.txt"))
  assert results["global_step"] == 40 and 0.0 <= results["accuracy"] <= 1.0
  assert _steps(model_dir)[-1] == 40
  predictions = np.loadtxt(os.path.join(model_dir, "predictions.txt"))
  np.testing.assert_allclose(predictions[:, 1:].sum(axis=1), 1.0, atol=1e-3)
  outputs = _serve(export_dir).signatures["classify"](tf.zeros([3, 8, 8]))
  assert outputs["probabilities"].shape == (3, 10)


@pytest.mark.slow
def test_resnet_like_async_checkpoints_then_its_eval_job_and_export(engine, tmp_path):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  common = [f"--model_dir={model_dir}", "--train_steps=10", "--iterations_per_loop=5",
            "--train_batch_size=32", "--eval_batch_size=32", "--num_eval_images=256"]
  _run(engine, "resnet_like/resnet_main.py", "--mode=train", *common)
  # AsyncCheckpointSaverHook(save_steps=5) became the engine's own saving, every 5 steps.
  assert _steps(model_dir) == [0, 5, 10]
  _run(engine, "resnet_like/resnet_main.py", "--mode=eval", "--eval_timeout=3",
       f"--export_dir={export_dir}", *common)
  with open(os.path.join(model_dir, "eval_results.txt")) as f:
    results = dict(item.split("=") for item in f.read().splitlines()[-1].split())
  assert int(results["global_step"]) == 10
  assert 0.0 <= float(results["top_1_accuracy"]) <= float(results["top_5_accuracy"]) <= 1.0
  outputs = _serve(export_dir).signatures["classify"](tf.zeros([3, 8, 8, 3]))
  assert outputs["probabilities"].shape == (3, 10)


@pytest.mark.slow
def test_bert_like_starts_from_its_init_checkpoint_once(engine, tmp_path):
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(BERT_CONFIG))
  init_checkpoint = _write_init_checkpoint(str(tmp_path / "pretrained" / "model.ckpt"))
  output_dir = str(tmp_path / "output")
  _run(engine, "bert_like/run_classifier.py", f"--bert_config_file={config}",
       f"--output_dir={output_dir}", f"--init_checkpoint={init_checkpoint}", "--do_train",
       "--do_eval", "--do_predict", "--num_train_examples=64", "--train_batch_size=8",
       "--num_eval_examples=16", "--eval_batch_size=8", "--save_checkpoints_steps=4")
  assert _steps(output_dir) == [0, 4, 8]
  # init_from_checkpoint set the embeddings once, at step 0: training then moved them.
  first = tf.train.load_variable(os.path.join(output_dir, "model.ckpt-0"),
                                 "bert/embeddings/word_embeddings")
  np.testing.assert_allclose(first, INIT_VALUE)
  last = tf.train.load_variable(os.path.join(output_dir, "model.ckpt-8"),
                                "bert/embeddings/word_embeddings")
  assert np.abs(last - INIT_VALUE).max() < 0.02 and not np.allclose(last, INIT_VALUE)
  results = _results(os.path.join(output_dir, "eval_results.txt"))
  assert results["global_step"] == 8 and 0.0 <= results["eval_accuracy"] <= 1.0
  probabilities = np.loadtxt(os.path.join(output_dir, "test_results.tsv"))
  assert probabilities.shape == (16, 2)


@pytest.mark.parametrize("program,names", [
    ("efficientnet_like/main.py", ("head/kernel/ExponentialMovingAverage",)),
    ("mnasnet_like/mnasnet_main.py", ("logits/kernel/ExponentialMovingAverage",)),
], ids=["efficientnet_like", "mnasnet_like"])
@pytest.mark.slow
def test_moving_average_models_train_evaluate_from_the_averages_and_export(
    engine, tmp_path, program, names):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  _run(engine, program, f"--model_dir={model_dir}", f"--export_dir={export_dir}",
       "--train_steps=10")
  results = _results(os.path.join(model_dir, "eval_results.txt"))
  assert results["global_step"] == 10 and 0.0 <= results["top_1_accuracy"] <= 1.0
  stored = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir))}
  assert set(names) <= stored and "stem_bn/moving_mean" in stored
  assert np.abs(tf.train.load_variable(model_dir, "stem_bn/moving_mean")).max() > 0
  assert len(os.listdir(export_dir)) == 1


@pytest.mark.slow
def test_albert_like_through_tensorflow_compat_v1_estimator(engine, tmp_path):
  output_dir = str(tmp_path / "albert")
  _run(engine, "albert_like/run_pretraining.py", f"--output_dir={output_dir}", "--do_train",
       "--do_eval", "--num_train_steps=8", "--save_checkpoints_steps=4")
  results = _results(os.path.join(output_dir, "eval_results.txt"))
  assert results["global_step"] == 8
  assert _steps(output_dir) == [0, 4, 8]
  assert results["loss"] > results["masked_lm_loss"] > 0
  # The estimator's checkpoint files: each with its meta graph, and graph.pbtxt.
  assert sorted(name for name in os.listdir(output_dir) if name.endswith(".meta")) == [
      "model.ckpt-0.meta", "model.ckpt-4.meta", "model.ckpt-8.meta"]
  assert os.path.exists(os.path.join(output_dir, "graph.pbtxt"))
