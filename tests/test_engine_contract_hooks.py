"""SessionRunHooks and eval_metric_ops on every engine: the same observations, step by step.

Each contract program (examples/legacy_corpus/contract/) records what its
hooks saw (the steps they fired at and the values they got), evaluate()'s
dicts and the event files they wrote; run with ESTIMATOR_TPU_ENGINE=estimator
and =distribute (and =jax where JAX is installed), they must agree. Run as a
script, this file is the child that evaluates eval_metric_ops on two replicas
(logical CPUs are set up before TensorFlow starts).
"""

import glob
import json
import math
import os
import shutil
import sys

import programs

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)  # as a child script too

import contract_programs  # noqa: E402
from contract_programs import CONTRACT  # noqa: E402
from contract_programs import OTHERS  # noqa: E402
from contract_programs import REPO  # noqa: E402
from contract_programs import run  # noqa: E402
from contract_programs import run_both  # noqa: E402
import pytest  # noqa: E402

pytestmark = pytest.mark.slow  # each program runs ~20-40 s per engine
CHILD_TIMEOUT_SECS = 300


def _assert_same(expected, actual, path="results"):
  """Equal structures; floats within 1e-4 (NaN equals NaN)."""
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for key in expected:
      _assert_same(expected[key], actual[key], f"{path}[{key!r}]")
  elif isinstance(expected, list):
    assert len(actual) == len(expected), f"{path}: {actual} != {expected}"
    for index, (want, got) in enumerate(zip(expected, actual)):
      _assert_same(want, got, f"{path}[{index}]")
  elif isinstance(expected, float) or isinstance(actual, float):
    assert (math.isnan(expected) and math.isnan(actual)) or actual == pytest.approx(
        expected, rel=1e-4, abs=1e-6), f"{path}: {actual} != {expected}"
  else:
    assert actual == expected, f"{path}: {actual} != {expected}"


def _events(directory):
  """{tag: [steps]} and the SessionLog steps of the event files in directory."""
  import tensorflow as tf
  tags = {}
  for path in sorted(glob.glob(os.path.join(directory, "events.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      if event.HasField("session_log"):
        tags.setdefault("session_log", []).append(event.step)
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append(event.step)
  return tags


def _scalars(directory, tag):
  import tensorflow as tf
  return [value.simple_value for path in sorted(glob.glob(os.path.join(directory, "events.*")))
          for event in tf.compat.v1.train.summary_iterator(path)
          for value in event.summary.value if value.tag == tag]


def test_hooks_given_to_train_evaluate_and_predict_see_the_same_steps_and_values(tmp_path):
  results = run_both("logging_hooks.py", tmp_path)
  for engine in OTHERS:
    _assert_same(results["estimator"], results[engine])
  seen = results["distribute"]
  first = seen["train_1"]
  # Every step of the loops of 4 steps, replayed in order, with what was asked for.
  assert [x["global_step"] for x in first["fetching"]] == list(range(1, 11))
  assert [sorted(x["results"]) for x in first["fetching"]] == [["loss", "nested"]] * 10
  assert first["fetching"][0]["results"]["nested"] == [[0.0]]  # mean prediction, zero weights
  assert len(first["every_3"]) == 4 and sorted(first["every_3"][0]) == ["loss", "mean"]
  # every_n_secs fires at the first step; at_end once more, on the next batch.
  assert len(first["daily"]) == 2 and first["daily"][1]["total_loss"] < first["daily"][0][
      "total_loss"]
  # FinalOpsHook's session.run ran the loss on a batch of its own (the one after at_end's).
  assert 0 < first["final_ops"]["loss"] != first["daily"][1]["total_loss"]
  assert first["fetching_calls"] == ["begin", ["after_create_session", 0], ["end", 10]]
  assert first["checkpoints"] == [0, 5, 10]
  # StopAtStepHook(num_steps=5), then (last_step=18): exactly there, not at a loop's end.
  assert seen["train_2"]["checkpoints"] == [0, 5, 10, 15]
  assert len(seen["train_2"]["fetching"]) == 5
  assert seen["train_3"]["checkpoints"] == [0, 5, 10, 15, 18]
  assert len(seen["evaluate"]["every_step"]) == 3 and seen["evaluate"]["metrics"][
      "global_step"] == 18
  assert len(seen["predict"]["fetching"]) == 8 and seen["predict"]["count"] == 64
  # StepCounterHook's steps/sec at the same steps (the values are times).
  steps = {engine: _events(str(tmp_path / engine / "model" / "step_rate"))
           for engine in results}
  for engine in results:
    assert steps[engine] == {"global_step/sec": [3, 5, 7, 9]}, engine


def test_a_nan_loss_stops_training_on_both_engines(tmp_path):
  # The program's NanTensorHook does not fail; the Estimator's own does, on both engines.
  results = run_both("logging_hooks.py", tmp_path, "--nan_at_step=5", "--nofail_on_nan_loss")
  for engine in OTHERS:
    _assert_same(results["estimator"], results[engine])
  seen = results["distribute"]
  assert seen["nan_error"] == "NanLossDuringTrainingError"
  losses = [x["results"]["loss"] for x in seen["train_1"]["fetching"]]
  assert len(losses) == 6 and math.isnan(losses[5]) and not any(map(math.isnan, losses[:5]))
  assert seen["train_1"]["checkpoints"] == [0, 5]


@pytest.mark.parametrize("spec", ["tpu", "estimator"])
def test_hooks_a_model_fn_returns_see_the_same_and_write_the_same_summaries(tmp_path, spec):
  results = run_both("model_fn_hooks.py", tmp_path, f"--spec={spec}")
  for engine in OTHERS:
    _assert_same(results["estimator"], results[engine])
  seen = results["distribute"]
  assert len(seen["train"]) == 10 and seen["train"][0]["train_op"] is None
  assert seen["train_calls"] == ["begin", "end"]
  assert len(seen["train_logging"]) == 5  # every 2 of 10 steps
  assert sorted(seen["final_ops"][0]) == ["bias", "weights"]
  assert len(seen["evaluate"]) == 6 and len(seen["evaluate_logging"]) == 3
  assert len(seen["predict"]) == 6 and seen["predictions"] == 48
  directories = {engine: str(tmp_path / engine / "model" / "hook_summaries") for engine in results}
  summaries = {engine: _events(directory) for engine, directory in directories.items()}
  expected = {"loss_summary", "weights_norm", "predictions", "session_log"}
  if spec == "estimator":  # the Estimator's `loss` summary, in the Scaffold's summary op
    expected.add("loss")
  for engine in results:
    assert set(summaries[engine]) == expected, engine
  for tag in expected - {"session_log"}:
    for engine in OTHERS:
      assert summaries[engine][tag] == [1, 4, 7, 10], (engine, tag)
    # TF's SummarySaverHook decides its next step from a global step read in the same run as
    # the train_op, which may or may not hold that run's increment: in a session it can save
    # a step early, at any of its saves ([1, 4, 6, 8] and [1, 3, ...] are seen under load). The
    # engine replays after the loop and reads the step the run began with, as an unloaded
    # session does.
    steps = summaries["estimator"][tag]
    assert steps[0] == 1 and all(1 <= b - a <= 3 for a, b in zip(steps, steps[1:])), tag
  values = {engine: dict(zip(summaries[engine]["loss_summary"],
                             _scalars(directory, "loss_summary")))
            for engine, directory in directories.items()}
  for engine in OTHERS:
    common = sorted(set(values[engine]) & set(values["estimator"]))
    assert common[0] == 1  # the first save is the first step's on every engine
    assert [values[engine][s] for s in common] == pytest.approx(
        [values["estimator"][s] for s in common], rel=1e-4), engine


@pytest.fixture(scope="module")
def eval_metric_ops(tmp_path_factory):
  """(work dir, {engine: results}) of eval_metric_ops.py, run once on each engine."""
  return contract_programs.run_shared(tmp_path_factory, "eval_metric_ops.py")


def test_eval_metric_ops_of_an_estimator_spec_give_the_estimators_dict(eval_metric_ops):
  _, results = eval_metric_ops
  for engine in OTHERS:
    _assert_same(results["estimator"], results[engine])
  seen = results["distribute"]
  assert seen["all"] == seen["again"]  # the metrics start from zero in each evaluation
  assert seen["two_steps"]["mean_label"] != seen["all"]["mean_label"]
  assert sorted(seen["all"]) == ["accuracy", "auc", "global_step", "loss", "mean_label",
                                 "precision", "rmse", "slim_accuracy",
                                 "slim_mean_probability"]
  assert seen["all"]["accuracy"] == seen["all"]["slim_accuracy"]


def _two_replica_child(model_dir):
  """evaluate() of eval_metric_ops.py's model on two replicas, from model_dir's checkpoint."""
  import importlib.util

  import tensorflow as tf
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  spec = importlib.util.spec_from_file_location(
      "eval_metric_ops", os.path.join(CONTRACT, "eval_metric_ops.py"))
  program = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(program)
  from estimator_tpu.engines.distribute import engine as distribute_engine
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  engine = distribute_engine.DistributeEngine(program.model_fn, {}, strategy, model_dir,
                                              train_batch_size=8, eval_batch_size=8)
  results = engine.evaluate(lambda params: program.input_fn(params, training=False))
  print(json.dumps({"replicas": engine.num_replicas, **program.plain(results)}))
  return 0


def test_eval_metric_ops_are_exact_over_two_replicas(eval_metric_ops, tmp_path):
  work_dir, results = eval_metric_ops
  one_device = results["estimator"]
  model_dir = str(tmp_path / "two_replicas")
  shutil.copytree(str(work_dir / "estimator" / "model"), model_dir)
  env = contract_programs.child_env(ESTIMATOR_TPU_ENGINE="distribute")
  process = programs.run([sys.executable, __file__, model_dir], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECS)
  assert process.returncode == 0, process.stderr[-3000:]
  two = json.loads(process.stdout.strip().splitlines()[-1])
  assert two.pop("replicas") == 2
  # Each replica updates its own copy of a metric's variables; the value sums them.
  _assert_same(one_device["all"], two)


@pytest.mark.skipif("jax" not in OTHERS, reason=contract_programs.NO_JAX)
def test_eval_metric_ops_are_exact_over_two_jax_devices(eval_metric_ops, tmp_path):
  one_device = eval_metric_ops[1]["estimator"]  # the estimator's run of the same program
  # The linear model trains the same on two devices (the mean of their gradients is the
  # global batch's); each device updates its own metric totals, the values sum them.
  two, out, _ = run("eval_metric_ops.py", "jax", tmp_path,
                    XLA_FLAGS="--xla_force_host_platform_device_count=2")
  assert out.splitlines()[0] == ("[estimator_tpu] engine: jax (2 cpu devices), from "
                                 "ESTIMATOR_TPU_ENGINE")
  _assert_same(one_device, two)


if __name__ == "__main__":
  sys.exit(_two_replica_child(sys.argv[1]))
