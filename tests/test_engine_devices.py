"""The distribute engine on every device of a machine and on many machines.

Several logical CPU devices stand in for several GPUs: a program run through
tests/logical_cpus.py configures 2 before TensorFlow starts. Multi-worker
runs are local processes with TF_CONFIG on localhost ports, set up as
tests/test_strategy_estimator.py sets up the estimator's workers.
"""

import collections
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from conftest import NUM_EVAL
from conftest import program_env
import numpy as np
import programs
import pytest
import tensorflow as tf
from test_legacy_corpus import BERT_CONFIG
from test_legacy_corpus import CORPUS
from test_legacy_corpus import REPO
from test_legacy_corpus import _results
from test_legacy_corpus import _steps
from test_legacy_corpus import _write_init_checkpoint
from test_strategy_estimator import _finish
from test_strategy_estimator import _free_ports

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.engines import choose
from estimator_tpu.engines import strategies
from estimator_tpu.engines.distribute import workers as workers_lib
from estimator_tpu.run import preemption

LOGICAL_CPUS = os.path.join(REPO, "tests", "logical_cpus.py")
MIRRORED_LINE = ("[estimator_tpu] engine: distribute (MirroredStrategy, 2 replicas), from "
                 "ESTIMATOR_TPU_ENGINE and ESTIMATOR_TPU_STRATEGY=mirrored")
TIMEOUT = 600


def _env(**extra):
  """A program's environment: TensorFlow's log level is the same for every program here.

  The rest that differs (the engine, the strategy, TF_CONFIG) is read only as a program runs,
  so one zygote of tests/programs.py, TensorFlow loaded once, forks them all.
  """
  return program_env(TF_CPP_MIN_LOG_LEVEL="3", **extra)


# Choosing the strategy.

def test_estimator_tpu_strategy_chooses_and_a_wrong_value_names_the_variable_and_choices():
  assert choose.program_strategy_name(False, {}) is None  # the default
  assert choose.program_strategy_name(True, {}) == "tpu"  # implied by use_tpu
  for name in ("one_device", "mirrored", "multi_worker", "tpu"):
    assert choose.program_strategy_name(True, {choose.STRATEGY_ENV: name.upper()}) == name
  with pytest.raises(config_lib.ConfigError) as e:
    choose.program_strategy_name(False, {choose.STRATEGY_ENV: "mirror"})
  assert str(e.value).startswith(
      "ESTIMATOR_TPU_STRATEGY='mirror' is not one of one_device, mirrored, multi_worker, tpu")
  assert "\n" not in str(e.value)
  assert choose.program_engine_source({}) == "ESTIMATOR_TPU_ENGINE"
  assert choose.program_engine_source({choose.STRATEGY_ENV: "mirrored"}) == (
      "ESTIMATOR_TPU_ENGINE and ESTIMATOR_TPU_STRATEGY=mirrored")


def test_a_strategy_for_tensorflows_tpuestimator_is_refused():
  environ = {choose.ENGINE_ENV: "estimator", choose.STRATEGY_ENV: "mirrored"}
  with pytest.raises(config_lib.ConfigError, match=r"ESTIMATOR_TPU_STRATEGY=mirrored is for "
                     r"ESTIMATOR_TPU_ENGINE=distribute or jax: TensorFlow's TPUEstimator takes no "
                     r"strategy"):
    choose.prepare_program_strategy(environ)
  choose.prepare_program_strategy({choose.ENGINE_ENV: "estimator"})  # nothing asked: fine
  choose.prepare_program_strategy({choose.ENGINE_ENV: "distribute",
                                   choose.STRATEGY_ENV: "one_device"})


def test_the_default_is_every_gpu_when_there_are_several_else_one_device(monkeypatch):
  made = []
  devices = {"GPU": [], "CPU": [tf.config.LogicalDevice("/device:CPU:0", "CPU"),
                                tf.config.LogicalDevice("/device:CPU:1", "CPU")]}
  monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind: devices[kind])
  monkeypatch.setattr(tf.distribute, "MirroredStrategy",
                      lambda devices: made.append(("mirrored", devices)) or "mirrored")
  monkeypatch.setattr(tf.distribute, "OneDeviceStrategy",
                      lambda device: made.append(("one", device)) or "one")
  # Logical CPUs only when asked for by name.
  assert strategies.default_strategy() == "one"
  assert strategies.make_strategy("mirrored") == "mirrored"
  devices["GPU"] = [tf.config.LogicalDevice("/device:GPU:0", "GPU")]
  assert strategies.default_strategy() == "one"
  devices["GPU"].append(tf.config.LogicalDevice("/device:GPU:1", "GPU"))
  assert strategies.default_strategy() == "mirrored"
  assert strategies.make_strategy("one_device") == "one"
  assert made == [("one", "/cpu:0"), ("mirrored", ["/device:CPU:0", "/device:CPU:1"]),
                  ("one", "/device:GPU:0"), ("mirrored", ["/device:GPU:0", "/device:GPU:1"]),
                  ("one", "/device:GPU:0")]


def test_a_global_batch_that_does_not_divide_is_refused_naming_both_numbers():
  class MirroredStrategy:
    num_replicas_in_sync = 4

  strategies.check_global_batches({"train_batch_size": 32, "eval_batch_size": None},
                                  MirroredStrategy())
  with pytest.raises(config_lib.ConfigError, match=(
      r"^eval_batch_size=10 does not divide over the 4 replicas of MirroredStrategy \(batch "
      r"sizes are global: each replica's params\['batch_size'\] is an equal share\); "
      r"try 8 or 12$")):
    strategies.check_global_batches({"train_batch_size": 32, "eval_batch_size": 10},
                                    MirroredStrategy())


def test_train_py_strategies_on_the_distribute_engine(tmp_path):
  config = config_lib.Config().replace("runtime", model_dir=str(tmp_path), engine="distribute")
  for strategy in ("none", "one_device", "mirrored", "multi_worker"):
    config.replace("runtime", strategy=strategy, mode="train").validate()
  config.replace("runtime", strategy="multi_worker").validate()  # train_and_eval
  runtime = config.replace("runtime", strategy="multi_worker", mode="eval").runtime
  with pytest.raises(config_lib.ConfigError, match=r"needs --mode=train or train_and_eval on "
                     r"every worker \(not --mode=eval\)"):
    strategies.check_multi_worker_mode(runtime)
  estimator = config.replace("runtime", strategy="multi_worker", engine="estimator").runtime
  with pytest.raises(config_lib.ConfigError, match=r"needs --mode=train on every worker"):
    strategies.check_multi_worker_mode(estimator)


# What a worker of a cluster does (the pieces, on one worker).

def test_a_held_signal_waits_until_the_workers_agree():
  watch = preemption.Watch(hold=True)
  with watch:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.time() + 10
    while watch.held is None and time.time() < deadline:
      time.sleep(0.01)
  assert watch.held == "SIGTERM" and not watch.requested
  hooks = [watch.hook(), watch.eval_hook(), tf.compat.v1.train.SessionRunHook()]
  assert preemption.watches_of(hooks) == [watch]
  watch.release("SIGTERM")
  assert watch.requested and watch.signal_name == "SIGTERM"


def test_one_worker_agrees_with_itself_and_writes():
  workers = workers_lib.Workers(tf.distribute.OneDeviceStrategy("/cpu:0"))
  assert workers.is_chief and not workers.many
  watch = preemption.Watch(hold=True)
  assert workers.agree_to_stop(True, [watch.hook()]) is True
  assert workers.agree_to_stop(False, [watch.hook()]) is False
  workers.barrier()


def test_an_input_fn_that_ignores_its_context_gets_every_nth_batch():
  from estimator_tpu.engines.distribute import engine as distribute_engine
  context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                       num_replicas_in_sync=2)
  params = {"batch_size": 2, "context": distribute_engine.HostContext(context)}

  def ignoring(params):
    return tf.data.Dataset.range(8).batch(params["batch_size"])

  def sharding(params):
    host = params["context"]
    return tf.data.Dataset.range(8).shard(host.num_hosts, host.current_host).batch(2)

  batches = {}
  for input_fn in (ignoring, sharding):
    watched, reads = workers_lib.watching_context(params)
    dataset = workers_lib.shard_unless_read(input_fn(watched), bool(reads), context)
    batches[input_fn.__name__] = [b.tolist() for b in dataset.as_numpy_iterator()]
  assert batches["ignoring"] == [[2, 3], [6, 7]]  # the one-device run's batches 1 and 3
  assert batches["sharding"] == [[1, 3], [5, 7]]  # its own sharding, not a second one


# A partial last batch over 2 replicas: the child process (run as a script).

PARTIAL_EXAMPLES = 17  # batches of 4 per replica: 4, 4, 4, 4, 1; the last step's second is empty


def _partial_model_fn(features, labels, mode, params):
  del params
  logits = tf.compat.v1.layers.dense(features, 3, name="logits")
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = None
  if mode == stacks.ModeKeys.TRAIN:
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=step)

  def metric_fn(labels, logits):
    ones = tf.ones_like(labels)
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1)),
            "examples": tf.compat.v1.metrics.true_positives(ones, ones)}

  return stacks.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op, eval_metrics=(metric_fn, [labels, logits]))


def _partial_input_fn(params):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(PARTIAL_EXAMPLES, 4)).astype(np.float32)
  y = rng.integers(0, 3, PARTIAL_EXAMPLES).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"])


def _partial_child(model_dir):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  from estimator_tpu.engines.distribute import engine as distribute_engine
  results = {}
  for name in ("one_device", "mirrored"):
    engine = distribute_engine.DistributeEngine(
        _partial_model_fn, {}, strategies.make_strategy(name), model_dir, 8, 8,
        iterations_per_loop=1, save_checkpoints_steps=2)
    engine.train(lambda params: _partial_input_fn(params).repeat(), max_steps=2)
    results[name] = {k: float(v) for k, v in engine.evaluate(_partial_input_fn).items()}
    results[name]["replicas"] = engine.num_replicas
  estimator = stacks.tpu.TPUEstimator(
      _partial_model_fn, config=stacks.tpu.RunConfig(model_dir=model_dir), use_tpu=False,
      train_batch_size=8, eval_batch_size=8)
  results["estimator"] = {k: float(v) for k, v in estimator.evaluate(_partial_input_fn).items()}
  print(json.dumps(results))
  return 0


@pytest.mark.slow
def test_a_partial_last_batch_over_two_replicas_evaluates_as_the_estimator(tmp_path):
  done = programs.run([sys.executable, __file__, "partial", str(tmp_path)], cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=TIMEOUT)
  assert done.returncode == 0, done.stderr[-3000:]
  results = json.loads(done.stdout.strip().splitlines()[-1])
  assert results["one_device"]["replicas"] == 1 and results["mirrored"]["replicas"] == 2
  reference = results["estimator"]
  assert reference["examples"] == PARTIAL_EXAMPLES and reference["global_step"] == 2
  for name in ("one_device", "mirrored"):
    for key in ("accuracy", "examples", "loss", "global_step"):
      assert results[name][key] == pytest.approx(reference[key], abs=1e-5), (name, key)


# Every corpus program on 2 replicas: the same evaluation as one device.

def _bert_args(tmp_path):
  config = tmp_path / "bert_config.json"
  config.write_text(json.dumps(BERT_CONFIG))
  init_checkpoint = _write_init_checkpoint(str(tmp_path / "pretrained" / "model.ckpt"))
  return [f"--bert_config_file={config}", f"--init_checkpoint={init_checkpoint}", "--do_train",
          "--do_eval", "--num_train_examples=64", "--train_batch_size=8",
          "--num_eval_examples=16", "--eval_batch_size=8", "--save_checkpoints_steps=4"]


def _resnet_results(model_dir):
  with open(os.path.join(model_dir, "eval_results.txt")) as f:
    return {key: float(value) for key, value in
            (item.split("=") for item in f.read().splitlines()[-1].split())}


RESNET = ["--train_steps=10", "--iterations_per_loop=5", "--train_batch_size=32",
          "--eval_batch_size=32", "--num_eval_images=256"]
# program: (model_dir flag, [flags of each run], the evaluation's results)
CORPUS_RUNS = {
    # Whole predict batches: a partial one leaves a replica tf.distribute's empty batch,
    # which TensorFlow's oneDNN convolutions on CPU reject (docs/TPU_AND_GPUS.md).
    "mnist_like/mnist_tpu.py": ("--model_dir", [["--train_steps=40", "--predict_examples=64"]],
                                lambda d: _results(os.path.join(d, "eval_results.txt"))),
    "resnet_like/resnet_main.py": ("--model_dir", [["--mode=train", *RESNET],
                                                   ["--mode=eval", "--eval_timeout=3", *RESNET]],
                                   _resnet_results),
    "bert_like/run_classifier.py": ("--output_dir", [["BERT"]],
                                    lambda d: _results(os.path.join(d, "eval_results.txt"))),
    "efficientnet_like/main.py": ("--model_dir", [["--train_steps=10"]],
                                  lambda d: _results(os.path.join(d, "eval_results.txt"))),
    "mnasnet_like/mnasnet_main.py": ("--model_dir", [["--train_steps=10"]],
                                     lambda d: _results(os.path.join(d, "eval_results.txt"))),
    "albert_like/run_pretraining.py": ("--output_dir", [["--do_train", "--do_eval",
                                                         "--num_train_steps=8"]],
                                       lambda d: _results(os.path.join(d, "eval_results.txt"))),
}


def _run_program(program, args, strategy, logical_cpus=None, **env):
  command = [sys.executable, os.path.join(CORPUS, program), *args]
  if logical_cpus:
    command = [sys.executable, LOGICAL_CPUS, str(logical_cpus), *command[1:]]
  done = programs.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                        env=_env(ESTIMATOR_TPU_ENGINE="distribute", ESTIMATOR_TPU_STRATEGY=strategy,
                                 **env))
  return done


@pytest.mark.slow
@pytest.mark.parametrize("program", sorted(CORPUS_RUNS), ids=lambda p: p.split("/")[0])
def test_each_corpus_program_on_two_replicas_evaluates_as_on_one_device(program, tmp_path):
  flag, runs, read_results = CORPUS_RUNS[program]
  extra = _bert_args(tmp_path) if program.startswith("bert") else []
  mirrored, one = str(tmp_path / "mirrored"), str(tmp_path / "one_device")
  for args in runs:
    args = [a for a in args if a != "BERT"] + extra
    done = _run_program(program, [f"{flag}={mirrored}", *args], "mirrored", logical_cpus=2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.splitlines()[0] == MIRRORED_LINE, done.stdout[:500]
  two_replicas = read_results(mirrored)
  # The same checkpoint, evaluated again on one device: its train() has nothing left to do.
  shutil.copytree(mirrored, one)
  args = [a for a in runs[-1] if a != "BERT"] + extra
  done = _run_program(program, [f"{flag}={one}", *args], "one_device")
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
  assert "(OneDeviceStrategy, 1 replica)" in done.stdout.splitlines()[0]
  one_device = read_results(one)
  assert sorted(two_replicas) == sorted(one_device)
  assert one_device["global_step"] == two_replicas["global_step"] > 0
  for name, value in one_device.items():
    assert two_replicas[name] == pytest.approx(value, abs=1e-3), name


@pytest.mark.slow
def test_a_global_batch_that_does_not_divide_stops_the_program_with_one_line(tmp_path):
  done = _run_program("mnist_like/mnist_tpu.py",
                      [f"--model_dir={tmp_path}", "--batch_size=63"], "mirrored", logical_cpus=2)
  assert done.returncode != 0
  assert ("train_batch_size=63 does not divide over the 2 replicas of MirroredStrategy"
          in done.stderr.splitlines()[-1]), done.stderr[-2000:]


# Many machines: local worker processes with TF_CONFIG.

TINY = ["--model=tiny", "--image_size=32", "--train_batch_size=16", "--eval_batch_size=16",
        "--norandom_flip", "--seed=1", "--iterations_per_loop=2"]


def _start_workers(command, cluster_of):
  """Starts one process per task of cluster_of(ports); returns them (tf_config's task order)."""
  ports = _free_ports(2)
  processes = []
  for task in cluster_of(ports):
    processes.append(programs.start(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(TF_CONFIG=json.dumps(task))))
  return processes


def _two_workers(ports):
  workers = [f"127.0.0.1:{port}" for port in ports]
  return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
          for i in range(2)]


def _chief_and_worker(ports):
  cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
  return [{"cluster": cluster, "task": {"type": kind, "index": 0}}
          for kind in ("chief", "worker")]


def _finish_all(processes):
  try:
    return [_finish(p, timeout=TIMEOUT) for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()


def _train_py_workers(digits_dir, model_dir, *flags):
  command = [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
             "--engine=distribute", "--strategy=multi_worker", *TINY, *flags]
  results = _finish_all(_start_workers(command, _two_workers))
  for code, out, err in results:
    assert code == 0, out[-2000:] + err[-3000:]
  return [out for _, out, _ in results]


def _history(model_dir):
  with open(os.path.join(model_dir, "eval_history.jsonl")) as f:
    return [json.loads(line) for line in f]


def _writers(model_dir):
  """The processes that wrote TF 2 event files under model_dir (their pids), and the TF 1 files.

  The TF 2 files (a host_call's summaries) name their writer's pid; the TF 1
  files (the estimator's, events.out.tfevents.TIME.HOST) one per directory
  and process, so two in one directory are two writers.
  """
  paths = glob.glob(os.path.join(model_dir, "**", "events.out.tfevents.*"), recursive=True)
  assert paths
  pids = {re.search(r"\.(\d+)\.\d+\.v2$", p).group(1) for p in paths if p.endswith(".v2")}
  tf1 = collections.Counter(os.path.dirname(p) for p in paths if not p.endswith(".v2"))
  return pids, tf1


@pytest.mark.slow
def test_two_workers_train_checkpoint_once_resume_and_evaluate_exactly(digits_dir, tmp_path):
  model_dir = str(tmp_path / "model")
  first = _train_py_workers(digits_dir, model_dir, "--train_steps=4", "--steps_per_eval=2")
  for out in first:
    assert out.splitlines()[0] == (
        "[estimator_tpu] engine: distribute (MultiWorkerMirroredStrategy, 2 replicas)")
    assert "step 4/4 | accuracy=" in out and f"num_eval_examples={NUM_EVAL}" in out
  # The chief alone wrote checkpoints, summaries and the history, each once.
  assert _steps(model_dir) == [0, 2, 4]
  assert [h["step"] for h in _history(model_dir)] == [2, 4]
  pids, tf1_files = _writers(model_dir)
  assert len(pids) <= 1 and tf1_files and set(tf1_files.values()) == {1}, (pids, tf1_files)
  assert not [name for name in os.listdir(model_dir) if name.startswith("tmp_")]

  second = _train_py_workers(digits_dir, model_dir, "--train_steps=6", "--steps_per_eval=2")
  for out in second:
    assert f"resuming from step 4 in {model_dir}" in out and "step 6/6 | accuracy=" in out
  assert _steps(model_dir)[-1] == 6
  by_cluster = _history(model_dir)[-1]
  assert by_cluster["step"] == 6 and by_cluster["num_eval_examples"] == NUM_EVAL

  # The same checkpoint evaluated by one process on TensorFlow's TPUEstimator.
  alone = str(tmp_path / "alone")
  shutil.copytree(model_dir, alone)
  os.remove(os.path.join(alone, "eval_history.jsonl"))
  done = programs.run(
      [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={alone}",
       "--mode=eval", "--engine=estimator", "--train_steps=6", "--eval_timeout_secs=5"],
      cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
      env=_env())
  assert done.returncode == 0, done.stderr[-3000:]
  by_one = _history(alone)[-1]
  assert by_one["step"] == 6
  for name in ("accuracy", "eval_loss", "macro_f1", "mean_per_class_accuracy",
               "num_eval_examples"):
    assert by_cluster[name] == pytest.approx(by_one[name], abs=1e-4), name


@pytest.mark.slow
@pytest.mark.parametrize("signalled", [0, 1], ids=["chief", "other_worker"])
def test_sigterm_to_one_worker_saves_and_exits_75_on_both(digits_dir, tmp_path, signalled):
  model_dir = str(tmp_path / "model")
  command = [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
             "--engine=distribute", "--strategy=multi_worker", "--mode=train",
             "--train_steps=100000", "--steps_per_eval=4", *TINY]
  processes = _start_workers(command, _two_workers)
  try:
    deadline = time.time() + TIMEOUT
    while not os.path.exists(os.path.join(model_dir, "model.ckpt-4.index")):
      assert time.time() < deadline and all(p.poll() is None for p in processes), (
          [p.communicate()[1][-2000:] for p in processes if p.poll() is not None])
      time.sleep(0.3)
    seen = _steps(model_dir)[-1]  # the newest checkpoint as the signal is sent
    processes[signalled].send_signal(signal.SIGTERM)
  finally:
    results = _finish_all(processes)
  lines = []
  for code, out, err in results:
    assert code == 75, out[-2000:] + err[-3000:]
    lines.append(out.splitlines()[-1])
  saved = _steps(model_dir)[-1]
  # The workers stop where their loop next meets: after the steps in flight, or right after
  # the save of `seen` when the signal came while that save was still going on (its index file
  # is there before the .meta and the workers' barrier that end it): then both say step `seen`,
  # as once in a full run and once in six runs that signalled within 10 ms of the index file.
  assert saved >= seen >= 4
  assert lines == [f"[estimator_tpu] preempted (SIGTERM) at step {saved}: checkpoint saved to "
                   f"{model_dir}/model.ckpt-{saved}; run the same command to resume"] * 2

  again = _train_py_workers(digits_dir, model_dir, "--mode=train", f"--train_steps={saved + 2}",
                            "--steps_per_eval=4")
  for out in again:
    assert f"resuming from step {saved} in {model_dir}" in out
    assert f"step {saved + 2}/{saved + 2}" in out
  assert _steps(model_dir)[-1] == saved + 2


@pytest.mark.slow
def test_a_program_on_two_workers_evaluates_and_predicts_as_on_one_device(tmp_path):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  program = os.path.join(CORPUS, "mnist_like", "mnist_tpu.py")
  command = [sys.executable, program, f"--model_dir={model_dir}", "--train_steps=40",
             "--predict_examples=64", f"--export_dir={export_dir}"]
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("ESTIMATOR_TPU_ENGINE", "distribute")
    patch.setenv("ESTIMATOR_TPU_STRATEGY", "multi_worker")
    results = _finish_all(_start_workers(command, _chief_and_worker))
  for code, out, err in results:
    assert code == 0, out[-2000:] + err[-3000:]
    assert out.splitlines()[0] == (
        "[estimator_tpu] engine: distribute (MultiWorkerMirroredStrategy, 2 replicas), from "
        "ESTIMATOR_TPU_ENGINE and ESTIMATOR_TPU_STRATEGY=multi_worker")
  assert _steps(model_dir) == [0, 40]
  assert len(os.listdir(export_dir)) == 1  # the chief's export only
  two_workers = _results(os.path.join(model_dir, "eval_results.txt"))
  predicted = np.loadtxt(os.path.join(model_dir, "predictions.txt"))

  one = str(tmp_path / "one")
  shutil.copytree(model_dir, one)
  done = _run_program("mnist_like/mnist_tpu.py", [f"--model_dir={one}", "--train_steps=40",
                                                   "--predict_examples=64"], "one_device")
  assert done.returncode == 0, done.stderr[-3000:]
  one_device = _results(os.path.join(one, "eval_results.txt"))
  assert one_device["global_step"] == two_workers["global_step"] == 40
  for name, value in one_device.items():
    assert two_workers[name] == pytest.approx(value, abs=1e-4), name
  np.testing.assert_allclose(np.loadtxt(os.path.join(one, "predictions.txt")), predicted,
                             atol=1e-4)


if __name__ == "__main__":
  sys.exit(_partial_child(sys.argv[2]))
