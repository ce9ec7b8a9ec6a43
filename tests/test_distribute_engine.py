"""--engine=distribute: the TPUEstimator contract in tf.functions, step for step with the estimator.

Both engines start from the same checkpoint and read the same fixed batches, so
their per-step losses, evaluations and checkpoints can be compared directly.
The MirroredStrategy runs are a program of their own (logical CPUs must be set up
before TensorFlow initializes its devices): run as a script, this file is that child.
"""

import glob
import json
import os
import shutil
import subprocess
import sys

import contract_programs
import numpy as np
import programs
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)  # as a child script too

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
from conftest import fixed_input_fn
from conftest import program_env
from conftest import summary_scalars
from conftest import tiny_config
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.engines.distribute import hooks as distribute_hooks
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.model import optimization

REPO_DIR = os.path.dirname(TESTS_DIR)
BATCH = 16
START = 2  # both engines go on from the checkpoint of this step
STEPS = 8
CHILD_TIMEOUT_SECS = 300


def _eval_input_fn(digits_dir):
  return input_pipeline.make_input_fn(
      os.path.join(digits_dir, "validation-*"), False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=BATCH)


def _config(model_dir, engine, strategy="none", **runtime):
  return tiny_config(model_dir, train_steps=STEPS, steps_per_eval=STEPS, train_batch_size=BATCH,
                     eval_batch_size=BATCH, base_learning_rate=0.5, lr_schedule="constant",
                     save_checkpoints_steps=START).replace(
      "runtime", engine=engine, strategy=strategy, iterations_per_loop=3, **runtime).validate()


def _build(model_dir, engine, model_fn=model_fn_lib.model_fn, **runtime):
  config = _config(model_dir, engine, **runtime)
  stacks.keras.utils.set_random_seed(1)  # the same initial weights on every call
  return estimator_lib.build_estimator(config, config.data.class_names, model_fn=model_fn)


def _host_call_losses(model_dir):
  """{step: train/loss} from the host_call event files in model_dir."""
  return summary_scalars(model_dir, "train/loss")


def _variables(model_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _from_one_start(tmp_path, engines, **runtime):
  """Trains START steps with the estimator, then each engine from there to STEPS in its own dir."""
  start = str(tmp_path / "start")
  _build(start, "estimator").train(fixed_input_fn, max_steps=START)
  dirs = {}
  for engine in engines:
    dirs[engine] = str(tmp_path / engine)
    shutil.copytree(start, dirs[engine])
    _build(dirs[engine], engine, **runtime).train(fixed_input_fn, max_steps=STEPS)
  return dirs


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory):
  return _from_one_start(tmp_path_factory.mktemp("engines"), ["estimator", "distribute"])


def test_each_step_after_a_shared_checkpoint_matches_the_estimator(two_engines):
  estimator = _host_call_losses(two_engines["estimator"])
  distribute = _host_call_losses(two_engines["distribute"])
  steps = list(range(START, STEPS))
  assert sorted(distribute) == sorted(estimator) == list(range(STEPS))
  for step in steps:
    assert distribute[step] == pytest.approx(estimator[step], rel=1e-3), step
  assert estimator[STEPS - 1] < estimator[START] - 0.1  # it trains


def test_the_checkpoint_holds_the_estimators_names_and_values(two_engines):
  estimator = _variables(two_engines["estimator"])
  distribute = _variables(two_engines["distribute"])
  assert sorted(distribute) == sorted(estimator)
  assert int(distribute["global_step"]) == STEPS
  assert any(name.endswith("/Momentum") for name in distribute)  # the optimizer's slots too
  for name, value in estimator.items():
    np.testing.assert_allclose(distribute[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
  # Checkpoints every save_checkpoints_steps, as the estimator's saver hook writes
  # them (0 and 2 are the estimator's, from the shared start).
  steps = sorted(int(p.rsplit("-", 1)[1][:-len(".index")])
                 for p in glob.glob(os.path.join(two_engines["distribute"], "model.ckpt-*.index")))
  assert steps == [0, START, 4, 6, STEPS]


def test_evaluation_counts_every_record_once_and_agrees(two_engines, digits_dir):
  model_dir = two_engines["distribute"]
  steps = input_pipeline.eval_steps(NUM_EVAL, BATCH)
  by_estimator = _build(model_dir, "estimator").evaluate(_eval_input_fn(digits_dir), steps=steps)
  by_engine = _build(model_dir, "distribute").evaluate(_eval_input_fn(digits_dir), steps=steps)
  assert by_engine["num_eval_examples"] == by_estimator["num_eval_examples"] == NUM_EVAL
  assert by_engine["global_step"] == STEPS
  for name in ("accuracy", "eval_loss", "mean_per_class_accuracy", "macro_f1"):
    assert by_engine[name] == pytest.approx(by_estimator[name], abs=1e-4), name
  # TensorBoard's eval tags, as the Estimator writes them, in model_dir/eval.
  tags = set()
  for path in glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value if event.step == STEPS)
  assert {"accuracy", "eval_loss", "loss", "num_eval_examples"} <= tags


def test_the_export_of_either_engine_predicts_the_same_classes(two_engines, digits_dir, tmp_path):
  from estimator_tpu.export import saved_model
  images = np.random.default_rng(3).uniform(-1, 1, (5, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(
      np.float32)
  classes = {}
  for engine in ("estimator", "distribute"):
    built = _build(two_engines["distribute"], engine)
    path = saved_model.export_saved_model(built, str(tmp_path / engine))
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["predict_images"]
    outputs = signature(images=tf.constant(images))
    classes[engine] = outputs["classid"].numpy().tolist()
  assert classes["distribute"] == classes["estimator"]
  assert len(classes["distribute"]) == 5


def test_predict_gives_every_example_its_classes(two_engines):
  built = _build(two_engines["distribute"], "distribute")

  def input_fn(params):
    return fixed_input_fn(params).take(2)

  predictions = list(built.predict(input_fn))
  assert len(predictions) == 2 * BATCH
  assert predictions[0]["probabilities"].shape == (10,)
  assert sum(predictions[0]["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_jit_compile_trains_the_same_steps_within_xla_tolerance(two_engines, tmp_path):
  if not stacks.HOST_XLA:  # the TPU build: refused, with the way out
    with pytest.raises(config_lib.ConfigError, match="--jit_compile needs XLA for the host"):
      _build(str(tmp_path), "distribute", jit_compile=True)
    return
  # From the checkpoint two_engines' estimator went on from (never written to: each engine
  # trained in a copy of it), against that estimator's steps.
  jit_dir = str(tmp_path / "distribute")
  shutil.copytree(os.path.join(os.path.dirname(two_engines["estimator"]), "start"), jit_dir)
  _build(jit_dir, "distribute", jit_compile=True).train(fixed_input_fn, max_steps=STEPS)
  jit = _host_call_losses(jit_dir)
  reference = _host_call_losses(two_engines["estimator"])
  for step in range(START, STEPS):
    assert jit[step] == pytest.approx(reference[step], rel=1e-2), step


def test_the_engine_names_itself(tmp_path):
  jit = stacks.HOST_XLA
  built = _build(str(tmp_path), "distribute", jit_compile=jit)
  config = _config(str(tmp_path), "distribute", jit_compile=jit)
  assert estimator_lib.describe_engine(built, config.runtime) == (
      f"distribute (OneDeviceStrategy, 1 replica{', jit_compile' if jit else ''})")
  estimator = _build(str(tmp_path), "estimator")
  assert estimator_lib.describe_engine(estimator, _config(str(tmp_path), "estimator").runtime) == (
      "estimator (TPUEstimator on CPU/GPU)")


def test_on_one_cpu_the_input_fns_dataset_is_iterated_as_it_is(tmp_path):
  # The strategy's distributed iterator (a MultiDeviceIterator to the same CPU) slowed every
  # ResNet-50 step a third (benchmarks/README.md); GPUs and several replicas keep it.
  built = _build(str(tmp_path), "distribute")
  engine = getattr(built, "_engine", built)
  dataset = engine._dataset(fixed_input_fn, stacks.ModeKeys.TRAIN)  # pylint: disable=protected-access
  assert isinstance(dataset, tf.data.Dataset)
  features, labels = next(iter(dataset))
  assert features["image"].shape == (BATCH, IMAGE_SIZE, IMAGE_SIZE, 3)
  assert labels.shape == (BATCH,)
  assert distribute_engine._on_the_host_cpu(tf.distribute.OneDeviceStrategy("/cpu:0"))  # pylint: disable=protected-access
  assert not distribute_engine._on_the_host_cpu(  # pylint: disable=protected-access
      tf.distribute.MirroredStrategy(["/cpu:0"]))


def test_auto_picks_the_distribute_engine_on_a_pjrt_tpu(tmp_path):
  runtime = _config(str(tmp_path), "auto").runtime
  assert estimator_lib.resolve_engine(runtime, environ={})[0] == "estimator"
  on_tpu = runtime.__class__(**dict(runtime.__dict__, use_tpu=True, tpu_topology="v5litepod-8"))
  assert estimator_lib.resolve_engine(on_tpu, environ={}) == (
      "distribute", "--engine=auto: the TPU runs TensorFlow through PJRT")
  v3 = runtime.__class__(**dict(runtime.__dict__, use_tpu=True, tpu_topology="v3-8"))
  assert estimator_lib.resolve_engine(v3, environ={})[0] == "estimator"
  assert estimator_lib.resolve_engine(v3, environ={"PJRT_DEVICE": "TPU"})[0] == "distribute"


def _loss_name():
  """The name of the model_fn's cross-entropy (tf.compat.v1.losses adds it to LOSSES)."""
  return tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0].name


class _Fetching(tf.compat.v1.train.SessionRunHook):
  """Asks for make_fetches() (called in begin) from its call number `first` on; keeps results."""

  def __init__(self, make_fetches, first=0):
    self._make, self._first, self.seen = make_fetches, first, []

  def begin(self):
    self._fetches = self._make()

  def before_run(self, run_context):
    if len(self.seen) >= self._first:
      return tf.compat.v1.train.SessionRunArgs(self._fetches)
    self.seen.append(None)
    return None

  def after_run(self, run_context, run_values):
    if run_values.results is not None:
      self.seen.append(run_values.results)


def test_a_hook_fetching_by_name_gets_every_step_of_a_loop(tmp_path):
  built = _build(str(tmp_path / "fetch"), "distribute")
  hook = _Fetching(lambda: {"step": "global_step:0", "loss": _loss_name()})
  built.train(fixed_input_fn, max_steps=5, hooks=[hook])  # loops of 2 (checkpoints), 2, 1
  assert [int(x["step"]) for x in hook.seen] == [0, 1, 2, 3, 4]
  assert all(np.isfinite(x["loss"]) and x["loss"] > 0 for x in hook.seen)


def test_a_hook_asking_for_a_new_tensor_inside_a_loop_is_refused_by_name(tmp_path):
  built = _build(str(tmp_path / "late"), "distribute")
  late = _Fetching(lambda: [_loss_name()], first=1)  # nothing at step 0, the loss at step 1
  with pytest.raises(distribute_hooks.UnsupportedHookError,
                     match=r"_Fetching asked at step 1 for .*loss.*iterations_per_loop=1"):
    built.train(fixed_input_fn, max_steps=2, hooks=[late])


def test_a_hook_that_feeds_is_refused_by_name(tmp_path):
  built = _build(str(tmp_path / "feed"), "distribute")
  feeding = tf.compat.v1.train.FeedFnHook(lambda: {"learning_rate:0": 1.0})
  with pytest.raises(distribute_hooks.UnsupportedHookError, match=r"FeedFnHook feeds the graph"):
    built.train(fixed_input_fn, max_steps=2, hooks=[feeding])


def test_a_profiler_hook_profiles_the_steps_it_picks_on_both_engines(tmp_path):
  outputs = {}
  for engine in ("estimator", "distribute"):
    outputs[engine] = str(tmp_path / engine / "profile")
    with tf.Graph().as_default():  # its FileWriter is made with the hook, in TF 1 graph mode
      profiler = tf.compat.v1.train.ProfilerHook(save_steps=3, output_dir=outputs[engine])
    _build(str(tmp_path / engine / "model"), engine).train(fixed_input_fn, max_steps=7,
                                                           hooks=[profiler])
  timelines = sorted(os.path.basename(p) for p in glob.glob(
      os.path.join(outputs["estimator"], "timeline-*.json")))
  assert timelines == ["timeline-3.json", "timeline-6.json"]
  # The engine's: a TensorBoard profile of the same steps, in place of each Chrome trace.
  profiles = sorted(p.split(os.sep)[-5] for p in glob.glob(
      os.path.join(outputs["distribute"], "timeline-*", "plugins", "profile", "*", "*.xplane.pb")))
  assert profiles == ["timeline-3", "timeline-6"]


def test_a_hook_that_asks_to_stop_ends_training_after_the_loop(tmp_path):
  model_dir = str(tmp_path / "stop")
  built = _build(model_dir, "distribute")

  class StopHook(tf.compat.v1.train.SessionRunHook):
    calls = 0

    def after_run(self, run_context, run_values):
      StopHook.calls += 1
      run_context.request_stop()

  built.train(fixed_input_fn, max_steps=STEPS, hooks=[StopHook()])
  assert StopHook.calls == 1
  # One loop (to the first checkpoint step, 2), then the checkpoint of the stop.
  assert os.path.basename(tf.train.latest_checkpoint(model_dir)) == f"model.ckpt-{START}"


def test_a_train_op_that_does_not_step_is_an_error(tmp_path):
  def model_fn(features, labels, mode, params):
    flat = tf.reshape(features["image"], [params["batch_size"], -1])
    logits = stacks.keras.layers.Dense(10)(flat)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)  # no global_step
    return stacks.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)

  built = _build(str(tmp_path), "distribute", model_fn=model_fn)
  with pytest.raises(ValueError, match="global step went from 0 to 0 in 2 training steps"):
    built.train(fixed_input_fn, max_steps=STEPS)


@pytest.mark.parametrize("engine", [
    "distribute",
    pytest.param("jax", marks=pytest.mark.skipif(not contract_programs.HAS_JAX,
                                                 reason=contract_programs.NO_JAX))])
def test_a_fresh_run_builds_the_model_fn_once_per_step_function_and_once_in_tf1(tmp_path,
                                                                                  engine):
  # The step function that makes the variables, the graph twin (TF 1's graph: initial
  # values, .meta, graph.pbtxt), the step function carrying the hooks' fetches. Made as
  # tf.function makes variables first created in its trace, the variables cost the whole
  # model_fn a second trace of the first step function ([True, True, False, True]).
  built_in = []

  def model_fn(features, labels, mode, params):
    built_in.append((mode, tf.compat.v1.get_default_graph().building_function))
    return model_fn_lib.model_fn(features, labels, mode, params)

  built = _build(str(tmp_path), engine, model_fn=model_fn, strategy="one_device")
  built.train(fixed_input_fn, max_steps=STEPS)
  assert built_in == [("train", True), ("train", False), ("train", True)]
  assert os.path.basename(tf.train.latest_checkpoint(str(tmp_path))) == f"model.ckpt-{STEPS}"


def test_hosts_get_their_share_through_params_context():
  context = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=2,
                                       num_replicas_in_sync=32)
  host = distribute_engine.HostContext(context)
  assert (host.num_hosts, host.current_host, host.num_replicas) == (4, 2, 32)
  assert input_pipeline.host_of(host) == (4, 2)


# MirroredStrategy over two logical CPUs: the child.

def _wrapping_model_fn(features, labels, mode, params):
  """Our model_fn with its optimizer always in a CrossShardOptimizer."""
  make = optimization.make_optimizer
  optimization.make_optimizer = lambda lr, p: tf.compat.v1.tpu.CrossShardOptimizer(make(lr, p))
  try:
    return model_fn_lib.model_fn(features, labels, mode, params)
  finally:
    optimization.make_optimizer = make


def _child(out_dir, digits_dir):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  start = os.path.join(out_dir, "start")
  _build(start, "estimator", strategy="mirrored").train(fixed_input_fn, max_steps=START)
  results = {}
  runs = {"estimator": ("estimator", model_fn_lib.model_fn),
          "distribute": ("distribute", model_fn_lib.model_fn),
          "cross_shard": ("distribute", _wrapping_model_fn)}
  steps = input_pipeline.eval_steps(NUM_EVAL, BATCH)
  for run, (engine, model_fn) in runs.items():
    model_dir = os.path.join(out_dir, run)
    shutil.copytree(start, model_dir)
    built = _build(model_dir, engine, model_fn=model_fn, strategy="mirrored")
    built.train(fixed_input_fn, max_steps=STEPS)
    evaluation = built.evaluate(_eval_input_fn(digits_dir), steps=steps)
    results[run] = {"eval_loss": float(evaluation["eval_loss"]),
                    "examples": float(evaluation["num_eval_examples"]),
                    "global_step": int(evaluation["global_step"]),
                    "replicas": estimator_lib.describe_engine(built, _config(
                        model_dir, engine, strategy="mirrored").runtime)}
  print(json.dumps(results))
  return 0


@pytest.mark.slow
def test_mirrored_on_two_cpus_matches_the_estimator_and_reduces_once(digits_dir, tmp_path):
  # The environment of most of the suite's programs (test_preflight.py's, test_engine_devices.py's):
  # their zygote of tests/programs.py forks this one too, where an environment of its own would
  # start another (TensorFlow loaded again). The child makes its two logical CPUs itself.
  env = program_env(TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_CONFIG", None)
  process = programs.run([sys.executable, __file__, str(tmp_path), digits_dir], cwd=REPO_DIR,
                           env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECS)
  assert process.returncode == 0, process.stderr[-3000:]
  results = json.loads(process.stdout.strip().splitlines()[-1])
  assert results["distribute"]["replicas"] == "distribute (MirroredStrategy, 2 replicas)"
  assert results["estimator"]["replicas"].startswith("estimator (Estimator, MirroredStrategy, 2")
  for run in results.values():
    assert run["examples"] == NUM_EVAL and run["global_step"] == STEPS
  reference = results["estimator"]["eval_loss"]
  assert results["distribute"]["eval_loss"] == pytest.approx(reference, rel=1e-3)
  # A CrossShardOptimizer adds no second reduction: the same mean gradient.
  assert results["cross_shard"]["eval_loss"] == pytest.approx(reference, rel=1e-3)
  # Per-step host_call losses are the mean over both replicas' examples.
  losses = _host_call_losses(str(tmp_path / "distribute"))
  assert sorted(losses) == list(range(STEPS))


if __name__ == "__main__":
  sys.exit(_child(sys.argv[1], sys.argv[2]))


# train.py with --engine=distribute, as a user runs it.

TINY = ["--model=tiny", f"--image_size={IMAGE_SIZE}", "--train_batch_size=8",
        "--eval_batch_size=8", "--norandom_flip", "--seed=1", "--iterations_per_loop=2"]


def _train_py(*args, timeout=240, fresh=False):
  from conftest import program_env
  return programs.run([sys.executable, "train.py", *args, *TINY], cwd=REPO_DIR, fresh=fresh,
                      env=program_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_train_py_runs_the_engine_then_the_estimator_resumes_it(tmp_path, digits_dir):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  first = _train_py(f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=4",
                    "--steps_per_eval=2", "--engine=distribute", f"--export_dir={export_dir}",
                    fresh=True)  # its start-up too is checked quiet
  assert first.returncode == 0, first.stderr[-3000:]
  lines = first.stdout.splitlines()
  assert lines[0] == "[estimator_tpu] engine: distribute (OneDeviceStrategy, 1 replica)"
  assert any(line.startswith("[estimator_tpu] step 4/4 | accuracy=") and
             f"num_eval_examples={NUM_EVAL}" in line for line in lines)
  assert any(line.startswith("[estimator_tpu] exported SavedModel to ") for line in lines)
  # Quiet: no TensorFlow log records or deprecation warnings reach the user.
  assert "W0000" not in first.stderr and "WARNING:tensorflow" not in first.stderr, first.stderr
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["runtime"]["engine"] == "distribute"

  second = _train_py(f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=6",
                     "--steps_per_eval=2", "--engine=estimator")
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.splitlines()[0] == (
      "[estimator_tpu] engine: estimator (TPUEstimator on CPU/GPU)")
  assert "resuming from step 4" in second.stdout
  assert "step 6/6 | accuracy=" in second.stdout
  with open(os.path.join(model_dir, "eval_history.jsonl")) as f:
    assert [json.loads(line)["step"] for line in f] == [2, 4, 6]


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_exits_75(tmp_path, digits_dir):
  import signal
  import time

  from conftest import program_env

  from estimator_tpu.run import loop
  model_dir = str(tmp_path / "model")
  process = programs.start(
      [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
       "--train_steps=100000", "--steps_per_eval=4", "--mode=train", "--engine=distribute",
       *TINY], cwd=REPO_DIR, env=program_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  deadline = time.time() + 120
  while time.time() < deadline and loop.current_step(model_dir) < 4:
    time.sleep(0.3)
  process.send_signal(signal.SIGTERM)
  out, err = process.communicate(timeout=120)
  assert process.returncode == 75, err[-3000:]
  saved = loop.current_step(model_dir)
  assert saved >= 4
  assert f"preempted (SIGTERM) at step {saved}: checkpoint saved to " in out
