"""The engines' inputs and how a program reaches them, on the estimator and the others.

Each contract program (examples/legacy_corpus/contract/) runs with
ESTIMATOR_TPU_ENGINE=estimator and =distribute (and =jax where JAX is
installed) and must give the same numbers:
an input_fn reading params['context'], input_fns returning tensors, a TF 1
main around the estimator, and every path and subclass to TPUEstimator.
"""

import glob
import json
import os
import sys

from conftest import program_env
from contract_programs import CONTRACT
from contract_programs import ENGINE_LINES
from contract_programs import OTHERS
from contract_programs import child_env
from contract_programs import run
from contract_programs import run_both
import numpy as np
import programs
import pytest
import tensorflow as tf
from tensorflow_estimator.python.estimator.tpu import tpu_context
from test_legacy_corpus_engine import ENGINE_LINE

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import context as context_lib
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.engines.distribute import inputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "/job:localhost/replica:0/task:0/device:CPU:0"


def _assert_same_numbers(estimator, distribute, *keys):
  for key in keys:
    np.testing.assert_allclose(np.asarray(distribute[key]), np.asarray(estimator[key]),
                               rtol=1e-5, atol=1e-6, err_msg=key)


def _assert_same_metrics(estimator, distribute):
  assert set(distribute) == set(estimator)
  for name, value in estimator.items():
    assert distribute[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


# params['context'] ---------------------------------------------------------------------------


# At a run's fresh start the distribute engine builds the model_fn once more in a TF 1 graph, as
# the estimator builds it (engines/distribute/graph_twin.py: initial values, a Scaffold's session
# work, .meta files), calling the training input_fn there with the same params, its output silenced.
GRAPH_TWIN = "one more training input_fn call, by the graph twin"


@pytest.fixture(params=OTHERS)
def engine(request):
  """Each engine that stands in for TPUEstimator: distribute (and jax where JAX installs)."""
  return request.param


@pytest.fixture(scope="module")
def context_reference(tmp_path_factory):
  """context_input_fn.py's results on the estimator, once for every engine compared with it."""
  return run("context_input_fn.py", "estimator", tmp_path_factory.mktemp("context"))[0]


@pytest.mark.slow
def test_the_input_fn_reads_every_context_attribute_and_shards_as_the_estimator(
    tmp_path, engine, context_reference):
  estimator = context_reference
  distribute, out, _ = run("context_input_fn.py", engine, tmp_path)
  assert out.splitlines()[0] == ENGINE_LINES[engine]
  _assert_same_metrics(estimator["metrics"], distribute["metrics"])
  assert distribute["metrics"]["global_step"] == 6
  _assert_same_numbers(estimator, distribute, "logits", "classes")
  # TPUEstimator with use_tpu=False hands no context; the engine hands its host's.
  for mode in ("train", "eval", "predict"):
    assert estimator["seen"][mode] == [{"batch_size": 8, "context": None}]
    calls = distribute["seen"][mode]
    if mode == "train":  # the graph twin's build at the fresh start calls it alike (GRAPH_TWIN)
      assert len(calls) == 2 and calls[1] == calls[0]
      calls = calls[:1]
    (seen,) = calls
    assert seen["batch_size"] == 8
    assert seen["context"] == {
        "deployment": [HOST, 0, 1, 1], "num_replicas": 1, "num_hosts": 1, "current_host": 0,
        "num_of_replicas_per_host": 1, "device_for_replica": [[HOST, 0]],
        "host_placement": [HOST], "mode": {"predict": "infer"}.get(mode, mode),
        "device_assignment": "This TPUContext instance must not be called from input_fn."}
  # Off TPU neither engine gives the model_fn a context.
  assert not any(distribute["seen"]["model_fn_has_context"] + estimator["seen"][
      "model_fn_has_context"])


def test_the_old_host_context_is_tensorflows_tpu_context():
  host = distribute_engine.HostContext(tf.distribute.InputContext(
      num_input_pipelines=4, input_pipeline_id=2, num_replicas_in_sync=32))
  assert isinstance(host, tpu_context.TPUContext)
  assert (host.num_hosts, host.current_host, host.num_replicas) == (4, 2, 32)
  assert host.current_input_fn_deployment() == (None, 2, 4, 8)
  with pytest.raises(ValueError, match="does not know the device of host 3 of 4"):
    host.device_for_replica(31)


def test_a_model_fn_context_answers_what_tpuestimator_answers_a_model_fn():
  hosts = ("/job:worker/replica:0/task:0/device:CPU:0",
           "/job:worker/replica:0/task:1/device:CPU:0")
  context = context_lib.for_model_fn(16, hosts, "train")
  assert (context.num_replicas, context.num_hosts, context.num_of_replicas_per_host) == (16, 2, 8)
  assert context.device_assignment is None  # no model parallelism, as on TPUEstimator
  assert context.device_for_replica(9) == (hosts[1], 1)
  assert context.tpu_host_placement_function(1) == hosts[1]
  with pytest.raises(RuntimeError, match="must not be called from model_fn"):
    context.current_input_fn_deployment()


class _Extended:
  def __init__(self, devices):
    self.worker_devices = devices


class _Strategy:
  def __init__(self, devices, resolver=None):
    self.extended = _Extended(devices)
    self.cluster_resolver = resolver


def test_hosts_are_the_tpu_hosts_and_each_workers_cpu_in_pipeline_order():
  tpu_cores = [f"/job:worker/replica:0/task:{task}/device:TPU:{core}"
               for task in range(2) for core in range(4)]
  assert context_lib.strategy_hosts(_Strategy(tpu_cores), 2) == (
      "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0")
  # A MultiWorkerMirroredStrategy lists its own devices only: the cluster names the rest.
  cluster = tf.train.ClusterSpec({"chief": ["a:1"], "worker": ["b:1", "c:1"]})
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, "worker", 1)
  local = ["/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1"]
  assert context_lib.strategy_hosts(_Strategy(local, resolver), 3) == (
      "/job:chief/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:CPU:0",
      "/job:worker/replica:0/task:1/device:CPU:0")


MIRRORED_CHILD = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from estimator_tpu import stacks
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.engines.distribute import inputs

seen = []

def input_fn(params):
  context = params["context"]
  seen.append({"batch_size": params["batch_size"], "num_replicas": context.num_replicas,
               "num_hosts": context.num_hosts, "per_host": context.num_of_replicas_per_host,
               "deployment": list(context.current_input_fn_deployment()),
               "replica_1": list(context.device_for_replica(1))})
  features = np.arange(64, dtype=np.float32).reshape(16, 4) / 64
  return tf.data.Dataset.from_tensor_slices(({"x": features}, np.arange(16) % 2)).repeat().batch(
      params["batch_size"], drop_remainder=True)

def model_fn(features, labels, mode, params):
  weights = tf.compat.v1.get_variable("w", [4, 2], initializer=tf.compat.v1.zeros_initializer())
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features["x"], weights))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return stacks.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
engine = distribute_engine.DistributeEngine(model_fn, {}, strategy, sys.argv[1], 8, 8)
engine.train(input_fn, max_steps=2)
try:
  distribute_engine.DistributeEngine(model_fn, {}, strategy, sys.argv[1] + "2", 5, 8).train(
      input_fn, max_steps=2)
  refused = None
except ValueError as e:
  refused = str(e)
print(json.dumps({"seen": seen, "refused": refused}))
"""


@pytest.mark.slow
def test_over_mirrored_replicas_each_gets_its_share_and_the_context_says_so(tmp_path):
  done = programs.run([sys.executable, "-c", MIRRORED_CHILD, str(tmp_path / "model")],
                        cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=child_env())
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout.strip().splitlines()[-1])
  # The host's call, and the graph twin's at the fresh start with the same params (GRAPH_TWIN).
  assert results["seen"] == 2 * [{"batch_size": 4, "num_replicas": 2, "num_hosts": 1,
                                  "per_host": 2, "deployment": [HOST, 0, 1, 2],
                                  "replica_1": [HOST, 1]}]
  assert results["refused"].startswith("train_batch_size=5 does not divide over the 2 replicas")


# What an input_fn may return -----------------------------------------------------------------


@pytest.mark.parametrize("train_input,predict_input,steps", [
    ("one_shot", "one_shot", 5),  # the iterator's 5 batches end training before step 8
    ("constant", "dataset", 8),
    ("queue", "dataset", 8)])
@pytest.mark.slow
def test_tensors_from_the_input_fns_graph_train_evaluate_and_predict_alike(
    tmp_path, train_input, predict_input, steps):
  results = run_both("tensor_input_fn.py", tmp_path, f"--train_input={train_input}",
                     f"--predict_input={predict_input}")
  estimator = results["estimator"]
  for engine in OTHERS:
    distribute = results[engine]
    _assert_same_metrics(estimator["metrics"], distribute["metrics"])
    assert distribute["metrics"]["global_step"] == steps
    _assert_same_numbers(estimator, distribute, "weights", "logits")
    assert len(distribute["logits"]) == 12
    assert distribute["shapes"] == estimator["shapes"] == {"eval": [[4, 4], [4]]}


def _host_values(input_fn, mode="eval", seed=None):
  dataset = inputs.host_dataset(input_fn, {"batch_size": 2}, mode, None,
                                tf.distribute.InputContext(), seed)
  return [tf.nest.map_structure(lambda t: t.numpy().tolist(), element) for element in dataset]


def test_a_dataset_reading_its_graphs_variable_runs_in_a_session_on_that_graph():
  def input_fn(params):
    offset = tf.compat.v1.get_variable("offset", initializer=tf.constant(10, tf.int64))
    return tf.data.Dataset.range(4).map(lambda x: x + offset).batch(params["batch_size"])

  dataset = inputs.host_dataset(input_fn, {"batch_size": 2}, "eval", None, None)
  assert not hasattr(dataset, "input_graph")  # streamed from the session, not carried out
  assert _host_values(input_fn) == [[10, 11], [12, 13]]


def test_a_dataset_of_random_ops_and_py_funcs_is_carried_out_of_its_graph_whole():
  def input_fn(params):
    dataset = tf.data.Dataset.range(6).shuffle(6).map(
        lambda x: tf.compat.v1.py_func(lambda v: v * 10, [x], tf.int64, stateful=True))
    return dataset.batch(params["batch_size"])

  dataset = inputs.host_dataset(input_fn, {"batch_size": 2}, "eval", None, None, seed=3)
  assert dataset.input_graph.seed == 3  # serialized, not streamed
  values = sorted(sum(_host_values(input_fn, seed=3), []))
  assert values == [0, 10, 20, 30, 40, 50]
  assert _host_values(input_fn, seed=3) == _host_values(input_fn, seed=3)


def test_what_the_estimator_refuses_from_an_input_fn_is_refused_alike():
  with pytest.raises(ValueError, match="input_fn should return \\(features, labels\\) as a len "
                     "2 tuple: it returned a Dataset whose elements are a tuple of 3"):
    _host_values(lambda params: tf.data.Dataset.from_tensors((1, 2, 3)))
  with pytest.raises(ValueError, match="does not include params argument"):
    _host_values(lambda: tf.data.Dataset.range(2))
  with pytest.raises(ValueError, match="eval_batch_size=10 must be divisible by the 4 replicas; "
                     "try 8 or 12"):
    inputs.replica_batch(10, 4, "eval_batch_size")
  with pytest.raises(ValueError, match="predict_batch_size is None: the 2 replicas"):
    inputs.replica_batch(None, 2, "predict_batch_size")
  assert inputs.replica_batch(None, 1, "predict_batch_size") is None


# The program's own TF 1 graph code ----------------------------------------------------------


def _event_values(log_dir):
  (events,) = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
  return {(value.tag, event.step): value.simple_value
          for event in tf.compat.v1.train.summary_iterator(events)
          for value in event.summary.value}


@pytest.mark.slow
def test_placeholders_sessions_file_writers_and_savers_around_the_engine(tmp_path):
  results = run_both("graph_mode_main.py", tmp_path)
  estimator = results["estimator"]
  for engine in OTHERS:
    distribute = results[engine]
    _assert_same_metrics(estimator["metrics"], distribute["metrics"])
    _assert_same_numbers(estimator, distribute, "mean", "std", "predicted", "restored")
    for seen, twin_calls in ((estimator, 0), (distribute, 1)):  # the graph twin's (GRAPH_TWIN)
      assert seen["mean_again"] == seen["mean"]
      np.testing.assert_allclose(seen["restored"], seen["predicted"], atol=1e-5)
      assert seen["seen"] == {"main_executing_eagerly": False, "after_executing_eagerly": False,
                              "input_fn_executing_eagerly": [False] * (3 + twin_calls)}
    values = _event_values(str(tmp_path / engine / "model" / "statistics"))
    assert values == {("loss", 6): pytest.approx(distribute["metrics"]["loss"])}


@pytest.fixture(scope="module")
def disabled_v2_reference(tmp_path_factory):
  """graph_mode_main.py --disable_v2_behavior's results on the estimator, once for every engine."""
  return run("graph_mode_main.py", "estimator", tmp_path_factory.mktemp("disabled_v2"),
             "--disable_v2_behavior")[0]


@pytest.mark.slow
def test_a_program_that_disables_v2_behavior_runs_on_the_engine(tmp_path, engine,
                                                                 disabled_v2_reference):
  distribute, out, _ = run("graph_mode_main.py", engine, tmp_path, "--disable_v2_behavior")
  assert out.splitlines()[0] == ENGINE_LINES[engine]
  reference = disabled_v2_reference
  _assert_same_metrics(reference["metrics"], distribute["metrics"])
  _assert_same_numbers(reference, distribute, "predicted", "restored")


# Every path to TPUEstimator ------------------------------------------------------------------


@pytest.fixture(scope="module")
def estimator_reference(tmp_path_factory):
  """estimator_paths.py through tf.contrib.tpu on TensorFlow's TPUEstimator."""
  results, out, _ = run("estimator_paths.py", "estimator", tmp_path_factory.mktemp("paths"))
  assert out.splitlines()[0] == "[estimator_tpu] engine: estimator (TPUEstimator on CPU/GPU)"
  return results


@pytest.mark.parametrize("path,subclass,engine", [
    ("contrib", "none", "distribute"), ("estimator", "empty", "distribute"),
    ("compat_v1", "added_method", "distribute"),
    ("tensorflow_compat_v1", "own_init", "distribute"),
    ("contrib_module", "base_init_by_name", "distribute"),
    ("tensorflow_estimator", "extends_evaluate", "distribute"),
    # The JAX engine is reached the same way (routing.py): a path and a subclass of each kind.
    *[("contrib", "own_init", engine) for engine in OTHERS[1:]],
    *[("tensorflow_estimator", "extends_evaluate", engine) for engine in OTHERS[1:]]])
@pytest.mark.slow
def test_each_path_and_subclass_reaches_the_engine(tmp_path, estimator_reference, path,
                                                   subclass, engine):
  distribute, out, _ = run("estimator_paths.py", engine, tmp_path, f"--path={path}",
                           f"--subclass={subclass}")
  assert out.splitlines()[0] == ENGINE_LINES[engine]
  expected = dict(estimator_reference["metrics"])
  if subclass == "extends_evaluate":  # its evaluate() runs, over the engine's
    expected["evaluated_by_subclass"] = 1.0
  _assert_same_metrics(expected, distribute["metrics"])
  _assert_same_numbers(estimator_reference, distribute, "logits", "served")
  seen = distribute["seen"]
  assert seen["is_base"] and seen["is_class"] and seen["is_estimator"]
  assert seen["class_name"] == {"none": "TPUEstimator", "empty": "MyEstimator",
                                "added_method": "AddingEstimator",
                                "own_init": "OwnInitEstimator",
                                "base_init_by_name": "ByNameEstimator",
                                "extends_evaluate": "TPUEstimator"}[subclass]
  if subclass == "added_method":
    assert seen["checkpoint_step"] == 6
  if subclass in ("own_init", "base_init_by_name"):
    assert seen["learning_rate"] == 0.5


@pytest.mark.slow
def test_a_subclass_latest_checkpoint_picks_the_export_as_on_the_estimator(tmp_path):
  results = run_both("estimator_paths.py", tmp_path, "--subclass=latest_checkpoint")
  estimator = results["estimator"]
  for engine in OTHERS:
    distribute = results[engine]
    _assert_same_metrics(estimator["metrics"], distribute["metrics"])
    # evaluate and predict read model_dir's latest; the export takes the subclass's (step 0).
    assert distribute["metrics"]["global_step"] == 6
    assert distribute["served"] == estimator["served"] == [[0.0, 0.0]] * 4
    _assert_same_numbers(estimator, distribute, "logits")


@pytest.mark.slow
def test_a_subclass_overriding_a_private_hook_stops_with_one_line(tmp_path):
  run("estimator_paths.py", "estimator", tmp_path, "--subclass=private_hook")
  model_dir = tmp_path / "distribute"
  done = programs.run(
      [sys.executable, os.path.join(CONTRACT, "estimator_paths.py"), f"--model_dir={model_dir}",
       f"--results={tmp_path / 'refused.json'}", "--subclass=private_hook"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_ENGINE="distribute"))
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1] == (
      "estimator_tpu.compat.engine.EngineRefusal: GlobalStepEstimator overrides "
      "TPUEstimator._create_and_assert_global_step, which the distribute engine never calls (it "
      "runs the model_fn in tf.functions under a tf.distribute strategy); run it with "
      "ESTIMATOR_TPU_ENGINE=estimator")
  assert not os.path.exists(model_dir)  # stopped before anything ran


def _linear_model_fn(features, labels, mode, params):
  del params
  weights = tf.compat.v1.get_variable("w", [4, 2], initializer=tf.compat.v1.zeros_initializer())
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, tf.matmul(features, weights))
  return stacks.tpu.TPUEstimatorSpec(mode, loss=loss)


@pytest.mark.parametrize("arguments,tpu_config,refused", [
    ({"use_tpu": True}, {"num_cores_per_replica": 2},
     r"TPUConfig\(num_cores_per_replica=...\) \(model parallelism\) is not on the distribute"),
    ({"use_tpu": True, "batch_axis": (0, 0)}, {}, r"TPUEstimator\(batch_axis=...\)"),
    ({"use_tpu": False, "warm_start_from": stacks.estimator.WarmStartSettings(
        "/tmp/ckpt", vars_to_warm_start="dense.*")}, {},
     r"WarmStartSettings with vars_to_warm_start, .* ESTIMATOR_TPU_ENGINE=estimator$")])
def test_what_the_engine_cannot_run_is_refused_at_construction(
    monkeypatch, tmp_path, arguments, tpu_config, refused):
  from estimator_tpu.compat import engine as compat_engine
  from estimator_tpu.compat import routing
  routing.install()
  monkeypatch.setenv("ESTIMATOR_TPU_ENGINE", "distribute")
  config = stacks.tpu.RunConfig(model_dir=str(tmp_path),
                                tpu_config=stacks.tpu.TPUConfig(**tpu_config))
  with pytest.raises(compat_engine.EngineRefusal, match=refused):
    stacks.tpu.TPUEstimator(model_fn=_linear_model_fn, config=config, train_batch_size=8,
                            **arguments)
  # TPUEstimator's own checks, with its messages.
  with pytest.raises(ValueError, match="`config` must be provided with type"):
    stacks.tpu.TPUEstimator(model_fn=_linear_model_fn, config=stacks.estimator.RunConfig(),
                            use_tpu=False)
  with pytest.raises(ValueError, match="are reserved keys but existed in params"):
    stacks.tpu.TPUEstimator(model_fn=_linear_model_fn, config=config, use_tpu=False,
                            params={"batch_size": 2})


@pytest.mark.skipif(stacks.NAME != "tf2.15", reason="TensorFlow 2.16+ lacks modules "
                    "tensorflow_estimator imports: it imports only after estimator_tpu's stand-ins")
@pytest.mark.slow
def test_tensorflow_estimators_class_imported_and_built_before_tf_reaches_the_engine(tmp_path):
  estimator, _, _ = run("estimator_imported_first.py", "estimator", tmp_path)
  distribute, out, _ = run("estimator_imported_first.py", "distribute", tmp_path)
  assert out.splitlines()[0] == ENGINE_LINE
  _assert_same_metrics(estimator["metrics"], distribute["metrics"])
  assert (estimator["class"], distribute["class"]) == ("TPUEstimator", "TPUEstimator")
