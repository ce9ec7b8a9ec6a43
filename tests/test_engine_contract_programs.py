"""Contract pieces held-out programs needed, each a program run on both engines.

eval_metrics in every form TPUEstimator takes off TPU, TF 2 summary writers
inside a TF 1 model_fn, Keras layers and models built in a model_fn, and a
plain Estimator built while ESTIMATOR_TPU_ENGINE is set: each program under
examples/legacy_corpus/contract/ records what it saw, and the engine must see
what the estimator sees.
"""

import json
import os
import shutil
import sys

from conftest import program_env
import contract_programs
from contract_programs import CONTRACT
from contract_programs import REPO
from contract_programs import run_both
import programs
import pytest

pytestmark = pytest.mark.slow  # each program runs ~10-40 s per engine
LOGICAL_CPUS = os.path.join(REPO, "tests", "logical_cpus.py")


def _same(expected, actual, path="results"):
  """Equal structures; floats within 1e-5."""
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for key in expected:
      _same(expected[key], actual[key], f"{path}[{key!r}]")
  elif isinstance(expected, list):
    assert len(actual) == len(expected), path
    for index, (want, got) in enumerate(zip(expected, actual)):
      _same(want, got, f"{path}[{index}]")
  elif isinstance(expected, float):
    assert actual == pytest.approx(expected, rel=1e-5, abs=1e-6), path
  else:
    assert actual == expected, path


def _two_replicas(program, work_dir, *args):
  """results of program on the distribute engine over two mirrored logical CPUs."""
  run_dir = os.path.join(str(work_dir), "two_replicas")
  results = os.path.join(run_dir, "results.json")
  done = programs.run(
      [sys.executable, LOGICAL_CPUS, "2", os.path.join(CONTRACT, program),
       f"--model_dir={os.path.join(run_dir, 'model')}", f"--results={results}", *args],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_ENGINE="distribute",
                      ESTIMATOR_TPU_STRATEGY="mirrored"))
  assert done.returncode == 0, done.stderr[-4000:]
  with open(results) as f:
    return json.load(f)


# --- eval_metrics_forms.py ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def metric_forms(tmp_path_factory):
  return run_both("eval_metrics_forms.py", tmp_path_factory.mktemp("metric_forms"))


def test_every_eval_metrics_form_gives_the_estimators_dict(metric_forms):
  by_estimator, by_engine = metric_forms["estimator"], metric_forms["distribute"]
  for engine in contract_programs.OTHERS:
    _same(by_estimator, metric_forms[engine])
  forms = ("list", "dict", "metric_ops", "closure", "estimator_spec")
  assert sorted(by_engine) == sorted([*forms, "refused"])
  # One checkpoint, five ways of asking for the same metrics: one answer.
  for form in forms:
    _same(by_engine["list"], {k: v for k, v in by_engine[form].items() if k != "mean_loss"})
  assert 0.5 < by_engine["list"]["accuracy"] < 1.0
  # The closure read the model_fn's loss, which it was not given: the mean of the batches' losses.
  assert by_engine["closure"]["mean_loss"] == pytest.approx(by_engine["closure"]["loss"], rel=1e-5)


def test_a_dict_of_metric_fns_is_refused_alike_naming_them(metric_forms):
  refused = metric_forms["distribute"]["refused"]
  for engine in contract_programs.OTHERS:
    assert metric_forms[engine]["refused"] == metric_forms["estimator"]["refused"], engine
  assert refused.startswith("TPUEstimatorSpec(eval_metrics=<dict>): ['accuracy'] are "
                            "(metric_fn, tensors) pairs")


def test_every_eval_metrics_form_is_exact_over_two_replicas(metric_forms, tmp_path):
  two = _two_replicas("eval_metrics_forms.py", tmp_path)
  # The host's metric_fn over the replicas' tensors, or each replica's metrics summed.
  _same(metric_forms["estimator"], two)



# --- tf2_summaries.py ---------------------------------------------------------------------------


def test_tf2_summaries_of_a_model_fn_are_the_estimators_events_and_files(tmp_path):
  results = {engine: contract_programs.run("tf2_summaries.py", engine, tmp_path)[0]
             for engine in ("estimator", "distribute")}
  _same(results["estimator"], results["distribute"])
  seen = results["distribute"]
  # record_if(step % 2 == 0): steps 0, 2 in the first train() call's file, 4 in the second's.
  assert seen["files"] == {"train": [[0, 2], [4]], "eval": [[5]]}
  assert sorted(seen["train"]) == ["logits", "train/positive_rate", "train_loss"]
  assert [step for step, _ in seen["train"]["train_loss"]] == [0, 2, 4]
  assert seen["train"]["train_loss"][0][1] == pytest.approx(0.6931472)  # log 2: zero weights
  assert [step for step, _ in seen["eval"]["eval_mean_logit"]] == [5, 5, 5]  # three batches


@pytest.mark.skipif("jax" not in contract_programs.OTHERS, reason="the JAX engine needs jax, "
                    "which this stack's lock does not install")
def test_tf2_summaries_in_the_step_are_refused_on_the_jax_engine_in_one_line(tmp_path):
  done = programs.run(
      [sys.executable, os.path.join(contract_programs.CONTRACT, "tf2_summaries.py"),
       f"--model_dir={tmp_path / 'model'}", f"--results={tmp_path / 'results.json'}"],
      cwd=contract_programs.REPO, capture_output=True, text=True, timeout=300,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_ENGINE="jax"))
  assert done.returncode != 0
  last = done.stderr.strip().splitlines()[-1]
  assert ("the train step of the model_fn uses a TensorFlow resource that is not a variable "
          "(tensorflow::SummaryWriterInterface)") in last
  assert "host_call" in last and "--engine=distribute" in last
  assert not (tmp_path / "results.json").exists()


def test_tf2_summaries_are_written_once_over_two_replicas(tmp_path):
  two = _two_replicas("tf2_summaries.py", tmp_path)
  assert two["files"] == {"train": [[0, 2], [4]], "eval": [[5]]}
  assert {tag: [s for s, _ in pairs] for tag, pairs in two["train"].items()} == {
      "logits": [0, 2, 4], "train/positive_rate": [0, 2, 4], "train_loss": [0, 2, 4]}


# --- plain_estimator.py -------------------------------------------------------------------------


def test_a_plain_estimator_says_in_one_line_that_it_runs_as_tensorflow_wrote_it(tmp_path):
  seen = {engine: contract_programs.run("plain_estimator.py", engine, tmp_path)
          for engine in contract_programs.ENGINES}
  assert seen["distribute"][0]["accuracy"] > 0.5
  lines = {engine: [line for line in stdout.splitlines() if "ESTIMATOR_TPU_ENGINE" in line]
           for engine, (_, stdout, _) in seen.items()}
  assert lines["estimator"] == [
      "[estimator_tpu] engine: estimator (Estimator, from ESTIMATOR_TPU_ENGINE=estimator)"]
  for engine in contract_programs.OTHERS:
    assert seen[engine][0] == seen["estimator"][0]  # the same Estimator ran every time
    line, = lines[engine]
    assert line.startswith(f"[estimator_tpu] engine: estimator (Estimator), not {engine}: "
                           f"ESTIMATOR_TPU_ENGINE={engine} runs TPUEstimator programs")
    assert "runs as TensorFlow wrote it" in line


def test_the_line_of_a_plain_estimator_follows_the_variable():
  from estimator_tpu.compat import plain_estimator
  assert plain_estimator.engine_line("DNNClassifier", {}) is None
  assert plain_estimator.engine_line("DNNClassifier", {"ESTIMATOR_TPU_ENGINE": "auto"}) == (
      "engine: estimator (DNNClassifier, from ESTIMATOR_TPU_ENGINE=auto)")
  assert "this DNNClassifier is not one" in plain_estimator.engine_line(
      "DNNClassifier", {"ESTIMATOR_TPU_ENGINE": "distribute"})


# --- keras_layers.py ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras_layers(tmp_path_factory):
  """(work dir, {engine: results}) of keras_layers.py, run once on each engine; never written to."""
  return contract_programs.run_shared(tmp_path_factory, "keras_layers.py")


def test_keras_layers_and_models_name_their_variables_as_the_estimator(keras_layers):
  _, results = keras_layers
  names = results["distribute"]["names"]
  for engine in contract_programs.OTHERS:
    assert results[engine]["names"] == results["estimator"]["names"], engine
  # Blocks in a subclassed Model called twice (one set), a functional Model in the scope
  # entered again, the batch norm subclass's moving statistics, the optimizer's slots.
  assert "backbone/backbone/block/tpu_batch_normalization/moving_mean" in names
  assert "backbone_1/conv2d_2/kernel" in names and "backbone_1/dense/kernel" in names
  assert "backbone/backbone/block_1/conv2d_1/kernel/Momentum" in names
  assert len(names) == 29
  for engine, seen in results.items():
    assert seen["evaluate"]["global_step"] == 4
    assert all(value != 0.0 for value in seen["moving_mean"]), engine  # UPDATE_OPS ran


def test_keras_models_checkpoints_read_both_ways(keras_layers, tmp_path):
  """Each engine evaluates the other's checkpoint and gets the other's evaluate() dict."""
  trained_dir, trained = keras_layers
  for reader, writer in (*[(engine, "estimator") for engine in contract_programs.OTHERS],
                         *[("estimator", engine) for engine in contract_programs.OTHERS]):
    work = tmp_path / f"{reader}_reads_{writer}"
    shutil.copytree(trained_dir / writer / "model", work / reader / "model")
    seen, _, _ = contract_programs.run("keras_layers.py", reader, work, "--evaluate_only")
    _same(trained[writer]["evaluate"], seen["evaluate"])
    _same(trained[writer]["moving_mean"], seen["moving_mean"])
