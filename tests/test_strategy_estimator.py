"""--strategy=mirrored and multi_worker: the same model_fn trained under tf.distribute on CPUs.

Training runs are fresh subprocesses: logical CPU devices and collective ops
must be set up before TensorFlow initializes. Run as a script, this file is
that child: python tests/test_distribute.py STRATEGY DEVICES DATA_DIR MODEL_DIR.
"""

import glob
import json
import os
import socket
import subprocess
import sys
import time

import programs
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)  # as a child script too

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
from conftest import program_env
from conftest import tiny_config
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.engines import strategies
from estimator_tpu.engines import strategy_estimator
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.model import networks

ModeKeys = stacks.ModeKeys
REPO_DIR = os.path.dirname(TESTS_DIR)
STEPS = 6
GLOBAL_BATCH = 16
LEARNING_RATE = 0.02  # x 16/256: the loss falls from ~4.6 to ~1.2 in 6 steps
SEED = 7
CHILD_TIMEOUT_SECS = 120


def _env(**extra):
  """program_env(): that of the other programs on many devices (test_engine_devices.py's).

  The same environment, TF_CONFIG aside (read only as a program runs), chooses the same
  zygote of tests/programs.py: TensorFlow is loaded once for the programs of both files.
  """
  env = program_env(TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_CONFIG", None)
  env.update(extra)
  return env


def _softmax_regression(params, use_bfloat16=False):
  """A network with no batch norm: [batch, h, w, 3] -> logits [batch, classes]."""
  del use_bfloat16
  return stacks.keras.Sequential([stacks.keras.layers.Flatten(),
                              stacks.keras.layers.Dense(params["num_label_classes"])])


def _child(strategy, devices, data_dir, model_dir):
  """Trains STEPS steps on a fixed example order; prints a JSON result line."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * int(devices))
  stacks.keras.utils.set_random_seed(SEED)  # Keras initializers draw Python random seeds
  # Batch norm normalizes by per-replica statistics (8 examples, not 16), a
  # real but expected difference; without it the two runs must agree closely.
  networks.build_network = _softmax_regression
  config = tiny_config(
      model_dir, train_steps=STEPS, steps_per_eval=STEPS, train_batch_size=GLOBAL_BATCH,
      eval_batch_size=GLOBAL_BATCH, base_learning_rate=LEARNING_RATE,
      lr_schedule="constant", seed=SEED).replace("runtime", strategy=strategy)
  eval_fn = input_pipeline.make_input_fn(
      os.path.join(data_dir, "validation-*"), False, IMAGE_SIZE,
      num_examples=NUM_EVAL, global_batch_size=GLOBAL_BATCH)
  estimator = estimator_lib.build_estimator(config, config.data.class_names)
  # The evaluation pipeline, repeated: no shuffling or augmentation, so both
  # runs see the same examples in the same order.
  estimator.train(lambda params: eval_fn(params).repeat(), max_steps=STEPS)
  results = estimator.evaluate(eval_fn, steps=input_pipeline.eval_steps(
      NUM_EVAL, GLOBAL_BATCH))
  replicas = (estimator.config.train_distribute.num_replicas_in_sync
              if strategy != "none" else 1)
  print(json.dumps({"eval_loss": float(results["eval_loss"]), "replicas": replicas,
                    "global_step": int(results["global_step"]),
                    "examples": float(results["num_eval_examples"])}))
  return 0


def _start_child(strategy, devices, data_dir, model_dir):
  return programs.start(
      [sys.executable, __file__, strategy, str(devices), data_dir, str(model_dir)],
      cwd=REPO_DIR, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process, timeout=CHILD_TIMEOUT_SECS):
  """(returncode, stdout, stderr); kills the process when it outlives timeout."""
  try:
    out, err = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    out, err = process.communicate()
    pytest.fail(f"{process.args} did not finish in {timeout}s:\n{err[-3000:]}")
  return process.returncode, out, err


def _result(process):
  code, out, err = _finish(process)
  assert code == 0, err[-3000:]
  return json.loads(out.strip().splitlines()[-1])


def _host_call_losses(model_dir):
  """{step: train/loss} from the host_call event files in model_dir."""
  losses = {}
  for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*.v2")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "train/loss":
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  return losses


@pytest.mark.slow
def test_mirrored_on_two_cpus_reaches_the_loss_of_one_device(digits_dir, tmp_path):
  one = _start_child("none", 1, digits_dir, tmp_path / "one")
  two = _start_child("mirrored", 2, digits_dir, tmp_path / "mirrored")
  single, mirrored = _result(one), _result(two)

  assert (single["replicas"], mirrored["replicas"]) == (1, 2)
  assert single["global_step"] == mirrored["global_step"] == STEPS
  # Distribution-aware metrics count every eval example once, over both replicas.
  assert single["examples"] == mirrored["examples"] == 37
  initial = _host_call_losses(str(tmp_path / "one"))[0]
  assert initial - single["eval_loss"] > 1.0, (initial, single)  # it did train
  # Same initial weights, same 16 examples per step: mean of the two replicas'
  # mean gradients = the mean gradient of the 16.
  assert mirrored["eval_loss"] == pytest.approx(single["eval_loss"], rel=1e-3)
  # host_call became a hook: one summary writer (the first replica's), every step.
  mirrored_dir = str(tmp_path / "mirrored")
  assert len(glob.glob(os.path.join(mirrored_dir, "events.out.tfevents.*.v2"))) == 1
  assert sorted(_host_call_losses(mirrored_dir)) == list(range(STEPS))


def _free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _wait_for_file(path, process, timeout=60):
  deadline = time.time() + timeout
  while time.time() < deadline and process.poll() is None:
    try:
      with open(path) as f:
        json.load(f)
      return
    except (OSError, ValueError):
      time.sleep(0.2)
  pytest.fail(f"{path} was not written: {process.communicate()[1][-3000:]}")


@pytest.mark.slow
def test_two_workers_train_one_model_from_tf_config(digits_dir, tmp_path):
  model_dir = str(tmp_path / "model")  # shared by the workers, as a gs:// dir would be
  workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
  command = [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
             "--model=tiny", "--image_size=32", "--train_steps=4", "--steps_per_eval=2",
             "--train_batch_size=16", "--eval_batch_size=16", "--norandom_flip",
             "--strategy=multi_worker", "--mode=train", "--summary_every_n_steps=1"]
  processes = []
  try:
    for index in range(2):
      tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
      processes.append(programs.start(
          command, cwd=REPO_DIR, env=_env(TF_CONFIG=json.dumps(tf_config)),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
      if index == 0:  # both write config.json: let the chief finish first
        _wait_for_file(os.path.join(model_dir, "config.json"), processes[0])
    results = [_finish(p, timeout=150) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  for code, _, err in results:
    assert code == 0, err[-3000:]
  assert "step 4/4" in results[0][1] and "step 4/4" in results[1][1]
  checkpoint = tf.train.latest_checkpoint(model_dir)
  assert checkpoint.endswith("model.ckpt-4")
  assert int(tf.train.load_variable(checkpoint, "global_step")) == 4
  # The other worker checkpoints and writes its summaries beside, not into, model_dir.
  assert os.path.isdir(os.path.join(model_dir, "tmp_worker_1"))
  assert sorted(_host_call_losses(model_dir)) == [0, 1, 2, 3]


def test_mirrored_strategy_gives_an_estimator_with_the_strategy(tmp_path):
  config = tiny_config(tmp_path, train_batch_size=16).replace("runtime", strategy="mirrored")
  estimator = estimator_lib.build_estimator(config)
  assert isinstance(estimator, strategy_estimator.StrategyEstimator)
  assert isinstance(estimator.estimator, stacks.estimator.Estimator)
  strategy = estimator.config.train_distribute
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert isinstance(estimator.config.eval_distribute, tf.distribute.MirroredStrategy)
  assert estimator.model_dir == str(tmp_path)  # other attributes are the Estimator's


def test_replica_batch_errors_name_the_flag_and_a_fix():
  train = config_lib.TrainConfig(train_batch_size=10, eval_batch_size=8)
  with pytest.raises(config_lib.ConfigError, match=r"--train_batch_size=10 must divide by the "
                     r"4 replicas of --strategy=mirrored \(each gets an equal share\); "
                     r"try 8 or 12"):
    strategies.check_replica_batches(train, "mirrored", 4)


def test_multi_worker_needs_tf_config_and_train_mode(tmp_path, monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  config = tiny_config(tmp_path).replace("runtime", strategy="multi_worker", mode="train")
  with pytest.raises(config_lib.ConfigError, match="needs the TF_CONFIG environment variable"):
    estimator_lib.build_estimator(config)
  monkeypatch.setenv("TF_CONFIG", "{not json")
  with pytest.raises(config_lib.ConfigError, match="TF_CONFIG is not valid JSON"):
    estimator_lib.build_estimator(config)
  with pytest.raises(config_lib.ConfigError, match="needs --mode=train on every worker"):
    estimator_lib.build_estimator(config.replace("runtime", mode="train_and_eval"))


def test_chief_is_the_chief_task_else_worker_0():
  workers = {"worker": ["a:1", "b:1"]}
  assert strategies.is_chief_task(
      {"cluster": workers, "task": {"type": "worker", "index": 0}})
  assert not strategies.is_chief_task({"cluster": workers,
                                          "task": {"type": "worker", "index": 1}})
  with_chief = dict(workers, chief=["c:1"])
  assert strategies.is_chief_task({"cluster": with_chief, "task": {"type": "chief"}})
  assert not strategies.is_chief_task({"cluster": with_chief,
                                          "task": {"type": "worker", "index": 0}})


def test_estimator_model_fn_turns_host_call_and_eval_metrics_into_estimator_spec(tmp_path):
  params = tiny_config(tmp_path, train_batch_size=8, eval_batch_size=8).to_params()
  wrapped = strategy_estimator.as_estimator_model_fn(
      model_fn_lib.model_fn, {ModeKeys.TRAIN: 8, ModeKeys.EVAL: 8})
  run_config = stacks.estimator.RunConfig(model_dir=str(tmp_path))
  with tf.Graph().as_default():
    features = {"image": tf.zeros([8, IMAGE_SIZE, IMAGE_SIZE, 3]),
                "weight": tf.ones([8])}
    labels = tf.zeros([8], tf.int32)
    train = wrapped(features, labels, ModeKeys.TRAIN, params, run_config)
    evaluation = wrapped(features, labels, ModeKeys.EVAL, params, run_config)
  assert isinstance(train, stacks.estimator.EstimatorSpec)
  assert [type(h).__name__ for h in train.training_hooks] == ["_OutfeedHostCallHook"]
  assert {"accuracy", "macro_f1", "eval_loss", "num_eval_examples"} <= set(
      evaluation.eval_metric_ops)


if __name__ == "__main__":
  sys.exit(_child(*sys.argv[1:]))
