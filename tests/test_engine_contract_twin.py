"""What the estimator does in a TF 1 graph and session, on the distribute engine: its graph twin.

Contract programs (examples/legacy_corpus/contract/) run on both engines and
their results are compared: a Scaffold's init_fn warm start (a Saver's
restore, slim's assign_from_checkpoint_fn), its init_op / init_feed_dict /
local_init_op / ready checks, variables whose initial value is a tensor, and
the `.meta` / graph.pbtxt the estimator writes (copied and imported as ALBERT's
run_pretraining.py does). In-process tests show what the engine refuses, and a
child process runs the twin under a MirroredStrategy over two logical CPUs.
"""

import json
import os
import sys

import contract_programs
import numpy as np
import programs
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.engines.distribute import graph_twin
from estimator_tpu.engines.distribute import hooks as distribute_hooks

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRETRAINED_KERNEL = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)
PRETRAINED_BIAS = [0.5, -0.25, 0.125]
START_BIAS = [0.75, -0.5, 0.25]  # scaffold_init_op.py's init_feed_dict
TOLERANCE = 1e-5


def _assert_close(a, b, path=""):
  """Nested results equal: exactly but for numbers, within TOLERANCE."""
  if isinstance(a, dict):
    assert sorted(a) == sorted(b), path
    for key in a:
      _assert_close(a[key], b[key], f"{path}/{key}")
  elif isinstance(a, float) or (isinstance(a, list) and _numeric(a)):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                               rtol=TOLERANCE, atol=TOLERANCE, err_msg=path)
  else:
    assert a == b, path


def _numeric(values):
  try:
    np.asarray(values, np.float64)
  except (TypeError, ValueError):
    return False
  return True


@pytest.mark.slow
@pytest.mark.parametrize("init", ["saver", "slim"])
def test_scaffold_init_fn_warm_starts_a_fresh_run_once(tmp_path, init):
  results = contract_programs.run_both("scaffold_init_fn.py", tmp_path, f"--init={init}")
  for engine, seen in results.items():
    # Called once, as init_fn(scaffold, session), by the first train() only.
    assert seen["init_calls"] == [["Scaffold", "Session"]], engine
    assert seen["init_calls_after_first_train"] == 1, engine
    np.testing.assert_array_equal(seen["at_start"]["dense/kernel"], PRETRAINED_KERNEL)
    np.testing.assert_array_equal(seen["at_start"]["dense/bias"], PRETRAINED_BIAS)
    assert seen["eval"]["global_step"] == 5
  for engine in contract_programs.OTHERS:
    _assert_close(results["estimator"], results[engine])


@pytest.mark.slow
def test_scaffold_init_op_feed_and_local_init_op_run_as_tf1_runs_them(tmp_path):
  results = contract_programs.run_both("scaffold_init_op.py", tmp_path)
  for engine, seen in results.items():
    np.testing.assert_array_equal(seen["at_start"]["dense/bias"], START_BIAS, err_msg=engine)
    np.testing.assert_array_equal(seen["at_start"]["dense/kernel"], np.full((4, 3), 0.1,
                                                                            np.float32))
    # local_init_op set the learning rate's scale (0 otherwise) at each start: both trained.
    first, resumed = seen["after_first_train"], seen["after_resumed_train"]
    assert not np.allclose(first["dense/bias"], START_BIAS)
    assert not np.allclose(resumed["dense/bias"], first["dense/bias"])
  # The resumed run's steps match only if its local_init_op ran again (the scale back to 1).
  for engine in contract_programs.OTHERS:
    _assert_close(results["estimator"], results[engine])


@pytest.mark.slow
def test_a_scaffold_whose_init_op_leaves_a_variable_out_stops_both_alike(tmp_path):
  results = contract_programs.run_both("scaffold_init_op.py", tmp_path, "--uninitialized")
  assert results["estimator"] == {
      "error": "Init operations did not make model ready for local_init. ",
      "uninitialized": "Variables not initialized: dense/kernel"}
  for engine in contract_programs.OTHERS:
    assert results[engine] == results["estimator"], engine


@pytest.fixture(scope="module")
def initial_values(tmp_path_factory):
  """tensor_initial_value.py's results on both engines, with RunConfig(tf_random_seed=42)."""
  return contract_programs.run_both("tensor_initial_value.py",
                                    tmp_path_factory.mktemp("initial_values"))


def test_tensor_initial_values_are_tf1s_under_the_seed(initial_values):
  results = initial_values
  start = {engine: seen["at_start"] for engine, seen in results.items()}
  # Every variable starts where TF 1 started it: exactly, random ones included.
  for engine in contract_programs.OTHERS:
    assert start[engine] == start["estimator"], engine
  noise = np.asarray(start["distribute"]["noise"])
  assert noise.shape == (4, 3) and np.all(noise != 0)
  np.testing.assert_allclose(start["distribute"]["doubled"], noise * 2.0 + 1.0, rtol=1e-6)
  bias = np.asarray(start["distribute"]["bias"])
  assert bias.shape == (3,) and np.all((bias > 0) & (bias < 1))
  for engine in contract_programs.OTHERS:
    _assert_close(results["estimator"], results[engine])


@pytest.mark.slow
def test_tensor_initial_values_follow_the_seed(initial_values, tmp_path):
  other = contract_programs.run("tensor_initial_value.py", "distribute", tmp_path,
                                "--seed=7")[0]["at_start"]
  at_42 = initial_values["distribute"]["at_start"]
  for name in ("noise", "bias", "doubled", "hidden/kernel"):  # op seeds combine with the graph's
    assert np.asarray(other[name]).shape == np.asarray(at_42[name]).shape
    assert not np.allclose(other[name], at_42[name]), name


@pytest.fixture(scope="module")
def meta_graph_reference(tmp_path_factory):
  """meta_graph_copy.py's results on the estimator, once for every engine compared with it."""
  return contract_programs.run("meta_graph_copy.py", "estimator",
                               tmp_path_factory.mktemp("meta_graph"))[0]


@pytest.mark.slow
@pytest.mark.parametrize("engine", contract_programs.OTHERS)
def test_checkpoints_carry_their_meta_graph_as_the_estimator_writes_it(tmp_path, engine,
                                                                     meta_graph_reference):
  results = {"estimator": meta_graph_reference,
             engine: contract_programs.run("meta_graph_copy.py", engine, tmp_path)[0]}
  seen = results[engine]
  assert seen["files"] == [
      "checkpoint", "eval", "events.out.tfevents", "graph.pbtxt",
      *[f"model.ckpt-{step}.{ext}" for step in (4, 6, "best")
        for ext in ("data-00000-of-00001", "index", "meta")]]
  assert seen["checkpoint"] == "model.ckpt-6"
  imported = seen["imported"]
  assert imported["variables"] == sorted(
      ["global_step", *[f"{layer}/{kind}{slot}" for layer in ("hidden", "logits")
                        for kind in ("kernel", "bias") for slot in ("", "/Momentum")]])
  assert {"savers", "train_op", "trainable_variables", "ready_op"} <= set(imported["collections"])
  assert np.asarray(imported["logits"]).shape == (8, 3)
  _assert_close(results["estimator"], seen)


@pytest.mark.slow
def test_no_graph_files_when_the_run_config_says_so(tmp_path):
  results = contract_programs.run_both("meta_graph_copy.py", tmp_path, "--nosave_graph_def")
  for engine in contract_programs.OTHERS:
    assert results[engine]["files"] == results["estimator"]["files"], engine
  assert results["distribute"]["files"] == [
      "checkpoint", "eval", "events.out.tfevents",
      *[f"model.ckpt-{step}.{ext}" for step in (4, 6) for ext in ("data-00000-of-00001", "index")]]
  for engine in contract_programs.OTHERS:
    assert results[engine] == results["estimator"], engine


# In process: what the engine refuses, naming it.

def _input_fn(params):
  x = np.random.RandomState(0).normal(size=(16, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(params["batch_size"])


def _engine(model_fn, model_dir):
  return distribute_engine.DistributeEngine(
      model_fn, {}, tf.distribute.OneDeviceStrategy("/cpu:0"), str(model_dir), 4, 4,
      iterations_per_loop=2)


def _linear(features, labels):
  kernel = tf.compat.v1.get_variable("dense/kernel", [4, 2])
  bias = tf.compat.v1.get_variable("dense/bias", [2], initializer=tf.compat.v1.zeros_initializer())
  logits = tf.matmul(features, kernel) + bias
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def test_a_scaffold_op_built_in_the_step_is_refused_naming_it(tmp_path):
  def model_fn(features, labels, mode, params):
    del params
    loss = _linear(features, labels)
    bias = [v for v in tf.compat.v1.global_variables() if v.op.name == "dense/bias"][0]
    with tf.control_dependencies([tf.compat.v1.global_variables_initializer()]):
      reset = bias.assign(tf.ones([2]))  # in the model_fn: the engine would run it every step
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return stacks.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                          scaffold=tf.compat.v1.train.Scaffold(init_op=reset))

  with pytest.raises(distribute_hooks.UnsupportedHookError,
                     match=r"Scaffold init_op \(AssignVariableOp .*\) is built in the step .*"
                           r"scaffold_fn"):
    _engine(model_fn, tmp_path).train(_input_fn, max_steps=2)


def test_a_local_init_op_in_evaluation_is_refused_naming_the_mode(tmp_path):
  def model_fn(features, labels, mode, params):
    del params
    loss = _linear(features, labels)
    if mode == stacks.ModeKeys.TRAIN:
      train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, tf.compat.v1.train.get_global_step())
      return stacks.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
    scaffold_fn = lambda: tf.compat.v1.train.Scaffold(local_init_op=tf.no_op())  # noqa: E731
    return stacks.tpu.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=scaffold_fn)

  engine = _engine(model_fn, tmp_path)
  engine.train(_input_fn, max_steps=2)
  with pytest.raises(distribute_hooks.UnsupportedHookError,
                     match="Scaffold sets local_init_op in eval mode"):
    engine.evaluate(_input_fn, steps=1)


class _LoadMovingAverages(tf.compat.v1.train.SessionRunHook):
  """Inception v3's LoadEMAHook: a Saver over the model's variables, built in begin()."""

  def __init__(self, model_dir):
    self._model_dir = model_dir

  def begin(self):
    averages = tf.compat.v1.train.ExponentialMovingAverage(0.5).variables_to_restore()
    self._load = tf.compat.v1.train.Saver(averages)

  def after_create_session(self, session, coord):
    del coord
    self._load.restore(session, tf.train.latest_checkpoint(self._model_dir))


def test_a_hook_restoring_moving_averages_in_its_session_sets_the_engines_variables(tmp_path):
  def model_fn(features, labels, mode, params):
    del params
    loss = _linear(features, labels)
    if mode != stacks.ModeKeys.TRAIN:
      return stacks.tpu.TPUEstimatorSpec(mode, loss=loss)
    step = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
        loss, tf.compat.v1.train.get_global_step())
    with tf.control_dependencies([step]):
      train_op = tf.compat.v1.train.ExponentialMovingAverage(0.5).apply(
          tf.compat.v1.trainable_variables())
    return stacks.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  engine = _engine(model_fn, tmp_path)
  engine.train(_input_fn, max_steps=4)
  engine.evaluate(_input_fn, steps=1)  # the EVAL step's variables, from the checkpoint
  checkpoint = tf.train.latest_checkpoint(str(tmp_path))
  average = tf.train.load_variable(checkpoint, "dense/kernel/ExponentialMovingAverage")
  assert not np.allclose(average, tf.train.load_variable(checkpoint, "dense/kernel"))
  twin = engine._graph_twin(_input_fn, False, mode=stacks.ModeKeys.EVAL,  # pylint: disable=protected-access
                            hooks=[_LoadMovingAverages(str(tmp_path))])
  twin.start(engine._store, engine.strategy, checkpoint)  # pylint: disable=protected-access
  kernel = engine._store.variables["dense/kernel"]  # pylint: disable=protected-access
  np.testing.assert_array_equal(kernel.numpy(), average)


# MirroredStrategy over two logical CPUs: the child.

def _twin_model_fn(features, labels, mode, params):
  """A tensor initial value and a scaffold_fn init_fn that restores a pretrained kernel."""
  del params
  kernel = tf.compat.v1.get_variable("dense/kernel", initializer=tf.zeros([4, 2]) + tf.range(2.0))
  noise = tf.compat.v1.Variable(tf.random.normal([2], seed=5), name="noise")
  logits = tf.matmul(features, kernel) + noise
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())

  def scaffold_fn():
    saver = tf.compat.v1.train.Saver({"pretrained": kernel})
    return tf.compat.v1.train.Scaffold(
        init_fn=lambda scaffold, session: saver.restore(session, PRETRAINED_PATH[0]))

  return stacks.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                                     scaffold_fn=scaffold_fn)


PRETRAINED_PATH = []


def _child(out_dir):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  path = os.path.join(out_dir, "pretrained", "model.ckpt")
  with tf.Graph().as_default():
    pretrained = tf.compat.v1.get_variable("pretrained", initializer=PRETRAINED_KERNEL[:, :2])
    with tf.compat.v1.Session() as session:
      session.run(pretrained.initializer)
      tf.compat.v1.train.Saver().save(session, path)
  PRETRAINED_PATH.append(path)
  results = {}
  for name, strategy in (("one_device", tf.distribute.OneDeviceStrategy("/cpu:0")),
                         ("mirrored", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    model_dir = os.path.join(out_dir, name)
    engine = distribute_engine.DistributeEngine(
        _twin_model_fn, {}, strategy, model_dir, 8, 8, iterations_per_loop=1,
        save_checkpoints_steps=100)
    engine.train(_input_fn, max_steps=2)
    start = os.path.join(model_dir, "model.ckpt-0")
    results[name] = {
        "start": {n: tf.train.load_variable(start, n).tolist() for n in ("dense/kernel", "noise")},
        "copies": [[v.numpy().tolist() for v in strategy.experimental_local_results(
            engine._store.variables[n])] for n in ("dense/kernel", "noise")],  # pylint: disable=protected-access
        "meta": os.path.exists(os.path.join(model_dir, "model.ckpt-2.meta")),
        "workers": graph_twin._workers(strategy),  # pylint: disable=protected-access
        "shared_seed": graph_twin._shared_seed(strategy)}  # pylint: disable=protected-access
  print(json.dumps(results))
  return 0


@pytest.mark.slow
def test_mirrored_replicas_each_start_from_the_twins_values(tmp_path):
  env = contract_programs.child_env()
  process = programs.run([sys.executable, __file__, str(tmp_path)], cwd=REPO_DIR, env=env,
                           capture_output=True, text=True, timeout=300)
  assert process.returncode == 0, process.stderr[-3000:]
  results = json.loads(process.stdout.strip().splitlines()[-1])
  for name, seen in results.items():
    np.testing.assert_array_equal(seen["start"]["dense/kernel"], PRETRAINED_KERNEL[:, :2])
    assert seen["meta"], name
    # One process: no seed to agree on; the all-reduce that agrees on one runs under both.
    assert seen["workers"] == 1 and 0 <= seen["shared_seed"] < 2 ** 31 - 1
  assert results["mirrored"]["start"] == results["one_device"]["start"]
  kernel_copies, noise_copies = results["mirrored"]["copies"]
  assert len(kernel_copies) == 2 and kernel_copies[0] == kernel_copies[1]
  assert noise_copies[0] == noise_copies[1]


if __name__ == "__main__":
  sys.exit(_child(sys.argv[1]))
