"""train.py end to end on CPU: the loop, exact evaluation, resume, config.json, clear errors."""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import flags
from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
from conftest import TINY_FLAGS
from conftest import program_env
from conftest import tiny_config
import numpy as np
import programs
import pytest
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import testing
from estimator_tpu.cli import train
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.run import assemble
from estimator_tpu.run import curves
from estimator_tpu.run import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = list(TINY_FLAGS)


def _flags(*args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", *args])
  return flag_values


def _run(*args):
  return train.run(_flags(*args))


def _history(model_dir):
  with open(os.path.join(model_dir, "eval_history.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_trained_model_dir_has_checkpoint_config_history_and_curves(trained_model_dir):
  assert loop.current_step(trained_model_dir) == 4
  saved = config_lib.read_config(trained_model_dir)
  assert saved.data.num_label_classes == 10
  assert saved.data.class_names == tuple(str(i) for i in range(10))
  assert saved.model.model == "tiny"
  history = _history(trained_model_dir)
  assert [h["step"] for h in history] == [4]
  assert history[0]["num_eval_examples"] == NUM_EVAL
  assert isinstance(history[0]["num_eval_examples"], int)  # 37, not 37.0
  assert "eval_loss" in history[0] and "loss" not in history[0]  # no second name for it
  # Exact eval: accuracy is a whole number of the 37 images over 37.
  correct = history[0]["accuracy"] * NUM_EVAL
  assert abs(correct - round(correct)) < 1e-4 and 0 <= round(correct) <= NUM_EVAL
  with open(os.path.join(trained_model_dir, "learning_curves.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_learning_curves_read_eval_loss_else_the_estimators_loss():
  history = [{"step": 2, "eval_loss": 1.5, "loss": 1.6, "num_eval_examples": 37.0},  # older files
             {"step": 4, "eval_loss": 1.25, "num_eval_examples": 37},
             {"step": 6, "loss": 0.75},  # a model_fn without an eval_loss metric
             {"step": 8, "accuracy": 0.5}]
  assert curves.eval_points(history, curves.EVAL_LOSS_KEYS) == [(2, 1.5), (4, 1.25), (6, 0.75)]
  assert curves.eval_points(history, ("accuracy",)) == [(8, 0.5)]


def _validation_bytes_and_labels(digits_dir):
  images, labels = [], []
  for path in sorted(tf.io.gfile.glob(f"{digits_dir}/validation-*")):
    for record in tf.data.TFRecordDataset(path):
      parsed = schema.parse_example(record)
      images.append(parsed["image_bytes"].numpy())
      labels.append(int(parsed["label"]))
  return images, np.array(labels)


def test_exact_eval_counts_37_with_batch_8_and_matches_numpy(trained_model_dir, digits_dir):
  config = config_lib.read_config(trained_model_dir)
  estimator = assemble.build(config)
  eval_fn = input_pipeline.make_input_fn(
      f"{digits_dir}/validation-*", False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=8)
  results = estimator.evaluate(eval_fn, steps=input_pipeline.eval_steps(NUM_EVAL, 8))
  images, labels = _validation_bytes_and_labels(digits_dir)
  assert len(images) == NUM_EVAL
  predictions = list(estimator.predict(
      input_pipeline.make_predict_input_fn(images, IMAGE_SIZE)))
  predicted = np.array([p["classid"] for p in predictions])
  assert results["num_eval_examples"] == NUM_EVAL
  np.testing.assert_allclose(results["accuracy"], np.mean(predicted == labels), atol=1e-6)
  assert predictions[0]["class"].decode() == str(predicted[0])


@pytest.mark.slow
def test_rerun_continues_from_the_last_checkpoint(tmp_path, digits_dir, trained_models, capsys):
  # What `--train_steps=2 --steps_per_eval=2` left (conftest's trained_models: trained once).
  model_dir = trained_models.copy(str(tmp_path / "m"), "--train_steps=2", "--steps_per_eval=2")
  assert _run(f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=5",
              "--steps_per_eval=2", *TINY) == 0
  assert loop.current_step(model_dir) == 5
  assert [h["step"] for h in _history(model_dir)] == [2, 4, 5]
  out = capsys.readouterr().out
  assert "resuming from step 2" in out
  assert "step 5/5" in out


@pytest.mark.slow
def test_killed_run_resumes_from_its_checkpoint_not_step_0(tmp_path, digits_dir):
  model_dir = str(tmp_path / "killed")
  command = [sys.executable, "train.py", f"--data_dir={digits_dir}",
             f"--model_dir={model_dir}", "--train_steps=100000", "--steps_per_eval=5",
             "--mode=train", *TINY]
  # program_env(): the environment of the other train.py programs here, so one zygote serves all.
  process = programs.start(command, cwd=REPO, env=program_env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  try:
    while time.time() < deadline and loop.current_step(model_dir) < 5:
      time.sleep(0.5)
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  killed_at = loop.current_step(model_dir)
  assert killed_at >= 5
  resumed = programs.run(
      [*command[:5], f"--train_steps={killed_at + 3}", *command[6:]], cwd=REPO,
      env=program_env(), capture_output=True, text=True, timeout=180)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resuming from step {killed_at}" in resumed.stdout
  assert loop.current_step(model_dir) == killed_at + 3


def _cpu_secs(pid):
  """User + system CPU seconds a process has used so far (Linux: /proc/PID/stat)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lines_of(stream):
  """A queue that gets each line of stream as a thread reads it (None at the end)."""
  lines = queue.Queue()

  def read():
    for line in stream:
      lines.put(line)
    lines.put(None)

  threading.Thread(target=read, daemon=True).start()
  return lines


def _until(lines, text, seen, timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    line = lines.get(timeout=max(deadline - time.time(), 0.1))
    assert line is not None, "".join(seen)
    seen.append(line)
    if text in line:
      return line
  raise AssertionError(f"no {text!r} in {''.join(seen)}")


def test_eval_mode_sleeps_while_it_waits_and_evaluates_a_new_checkpoint(
    tmp_path, trained_model_dir, digits_dir):
  model_dir = str(tmp_path / "evaluated")
  os.makedirs(model_dir)
  shutil.copy(os.path.join(trained_model_dir, config_lib.CONFIG_FILE), model_dir)
  process = programs.start(
      [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
       "--mode=eval", "--train_steps=4", "--eval_timeout_secs=600"], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=program_env())
  try:
    lines, seen = _lines_of(process.stdout), []
    waiting = _until(lines, "waiting for", seen)
    assert f"waiting for a checkpoint in {model_dir}" in waiting
    cpu, wall = _cpu_secs(process.pid), time.time()
    time.sleep(4)
    busy = (_cpu_secs(process.pid) - cpu) / (time.time() - wall)
    assert busy < 0.05, f"the waiting evaluator used {busy:.0%} of a core"
    # The trainer's next checkpoint: its files, then the index that names it.
    newest = tf.train.latest_checkpoint(trained_model_dir)
    for path in tf.io.gfile.glob(newest + ".*"):
      shutil.copy(path, model_dir)
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, os.path.join(model_dir, os.path.basename(newest)))
    _until(lines, "step 4/4", seen)
    assert process.wait(timeout=120) == 0, process.stderr.read()[-2000:]
  finally:
    process.kill()
  assert sum("waiting for" in line for line in seen) == 1, "".join(seen)
  assert _history(model_dir)[-1]["num_eval_examples"] == NUM_EVAL


def test_eval_batch_larger_than_the_eval_set_is_padded(tmp_path, digits_dir):
  model_dir = str(tmp_path / "big_batch")
  assert _run(f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=1",
              "--steps_per_eval=1", *TINY, "--eval_batch_size=64") == 0
  assert _history(model_dir)[0]["num_eval_examples"] == NUM_EVAL


def test_tpu_reference_layout_trains_with_num_label_classes(tmp_path):
  data_dir = testing.write_digits_dataset(str(tmp_path / "tpu_layout"), num_train=40,
                                          num_eval=11, write_manifest=False)
  os.remove(os.path.join(data_dir, "labels.txt"))
  model_dir = str(tmp_path / "m")
  assert _run(f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--train_steps=1",
              "--steps_per_eval=1", "--num_label_classes=10", *TINY) == 0
  assert _history(model_dir)[0]["num_eval_examples"] == 11


def _stopped_preprocess_output(folder, command=None):
  """What a preprocess.py run stopped midway leaves: some shards, its temporary folder."""
  data_dir = testing.write_digits_dataset(folder, num_train=40, num_eval=11)
  os.remove(os.path.join(data_dir, "manifest.json"))
  temp = os.path.join(data_dir, ".preprocess-temp-0123abcd")
  os.mkdir(temp)
  if command:
    with open(os.path.join(temp, "command.txt"), "w") as f:
      f.write(command + "\n")
  return data_dir


def test_the_output_of_a_stopped_preprocess_run_is_refused_with_the_command_to_finish_it(
    tmp_path, capsys):
  command = f"python preprocess.py --input_dir=photos --output_dir={tmp_path}/d"
  data_dir = _stopped_preprocess_output(str(tmp_path / "d"), command)
  message = _error(capsys, f"--data_dir={data_dir}", f"--model_dir={tmp_path}/m", *TINY)
  assert message == (
      f"train.py: error: --data_dir={data_dir} holds the output of a preprocess.py run that "
      "stopped before it finished (.preprocess-temp-0123abcd/, no manifest.json); finish it "
      f"with the command that started it: {command}")
  message = _error(capsys, f"--train_data={data_dir}/train-*", f"--eval_data={data_dir}/valid*",
                   "--num_label_classes=10", f"--model_dir={tmp_path}/m", *TINY)
  assert message.startswith(f"train.py: error: --train_data={data_dir}/train-*: its folder "
                            f"{data_dir} holds the output of a preprocess.py run that stopped")
  assert not os.path.exists(f"{tmp_path}/m/config.json")


def test_a_stopped_runs_folder_without_its_command_or_with_its_manifest(tmp_path):
  from estimator_tpu.data import data_dir as data_dir_lib
  data_dir = _stopped_preprocess_output(str(tmp_path / "d"))
  with pytest.raises(config_lib.ConfigError, match=(
      r"no manifest.json\); run the preprocess.py command that wrote it again "
      rf"\(--output_dir={data_dir}\)$")):
    data_dir_lib.resolve(config_lib.DataConfig(data_dir=data_dir))
  # A run killed after its manifest.json, before it removed its temporary folder, is complete.
  complete = testing.write_digits_dataset(str(tmp_path / "c"), num_train=40, num_eval=11)
  os.mkdir(os.path.join(complete, ".preprocess-temp-0123abcd"))
  info = data_dir_lib.resolve(config_lib.DataConfig(data_dir=complete))
  assert (info.num_train_examples, info.num_eval_examples) == (40, 11)


def _error(capsys, *args):
  assert _run(*args) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  return err[0]


def test_conflicting_rerun_names_both_values_and_changes_nothing(trained_model_dir,
                                                                 digits_dir, capsys):
  path = os.path.join(trained_model_dir, "config.json")
  with open(path) as f:
    before = f.read()
  message = _error(capsys, f"--data_dir={digits_dir}", f"--model_dir={trained_model_dir}",
                   "--image_size=64")
  assert "--image_size=64" in message and "image_size=32" in message
  message = _error(capsys, f"--data_dir={digits_dir}", f"--model_dir={trained_model_dir}",
                   "--model=flowers")
  assert "--model=flowers" in message and "model=tiny" in message
  with open(path) as f:
    assert f.read() == before


def test_clear_errors_for_bad_input(tmp_path, digits_dir, capsys):
  model_dir = str(tmp_path / "m")
  message = _error(capsys, f"--train_data={tmp_path}/nothing-*",
                   f"--eval_data={digits_dir}/validation-*", f"--model_dir={model_dir}",
                   "--num_label_classes=10")
  assert f"{tmp_path}/nothing-*" in message and "no files match" in message
  message = _error(capsys, f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
                   "--use_tpu", "--train_batch_size=100", "--num_cores=8")
  assert "--train_batch_size=100" in message and "--num_cores=8" in message
  assert "96" in message and "104" in message
  assert not os.path.exists(os.path.join(model_dir, "config.json"))


def test_labels_disagreeing_with_manifest_is_an_error(tmp_path, capsys):
  data_dir = testing.write_digits_dataset(str(tmp_path / "d"), num_train=10, num_eval=5)
  with open(os.path.join(data_dir, "labels.txt"), "w") as f:
    f.write("\n".join(str(i) for i in range(11)))
  message = _error(capsys, f"--data_dir={data_dir}", f"--model_dir={tmp_path}/m", *TINY)
  assert "labels.txt (11 classes)" in message and "manifest.json (10 classes)" in message


def test_export_without_checkpoint_is_an_error(tmp_path):
  result = programs.run(
      [sys.executable, "export.py", f"--model_dir={tmp_path}", f"--export_dir={tmp_path}/e"],
      cwd=REPO, env=program_env(), capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert f"--model_dir={tmp_path} holds no config.json" in result.stderr
  assert not os.path.exists(f"{tmp_path}/e")


def _export(model_dir, export_dir):
  from estimator_tpu.cli import export
  flag_values = flags.FlagValues()
  export.define_flags(flag_values)
  flag_values(["export.py", f"--model_dir={model_dir}", f"--export_dir={export_dir}"])
  return export.run(flag_values)


def _versions(export_dir):
  return sorted(os.listdir(export_dir), key=int)


def test_a_rerun_export_of_an_exported_checkpoint_publishes_nothing_a_new_one_does(
    trained_model_dir, digits_dir, tmp_path, capsys):
  model_dir, export_dir = str(tmp_path / "m"), str(tmp_path / "e")
  shutil.copytree(trained_model_dir, model_dir)
  capsys.readouterr()
  assert _export(model_dir, export_dir) == 0
  [first] = _versions(export_dir)
  assert _export(model_dir, export_dir) == 0
  assert _versions(export_dir) == [first]
  checkpoint = tf.train.latest_checkpoint(model_dir)
  said = capsys.readouterr().out.splitlines()
  assert said[-1] == (f"[estimator_tpu] {checkpoint} is already exported to {export_dir} as "
                      f"version {first}, the newest, which TF Serving serves; no new version "
                      "published")
  # Two more steps: a new checkpoint, published by train.py --export_dir; its re-run publishes
  # nothing and names that version; the first is now an older one.
  command = (f"--data_dir={digits_dir}", f"--model_dir={model_dir}", f"--export_dir={export_dir}",
             "--train_steps=6", "--steps_per_eval=2", *TINY)
  assert _run(*command) == 0
  [_, second] = _versions(export_dir)
  assert _run(*command) == 0
  assert _versions(export_dir) == [first, second]
  said = capsys.readouterr().out.splitlines()
  assert [line for line in said if "no new version" in line] == [
      f"[estimator_tpu] {tf.train.latest_checkpoint(model_dir)} is already exported to "
      f"{export_dir} as version {second}, the newest, which TF Serving serves; no new version "
      "published"]
  assert _export(model_dir, export_dir) == 0
  assert _versions(export_dir) == [first, second]
  shutil.rmtree(os.path.join(export_dir, second))
  assert _export(model_dir, export_dir) == 0  # the newest checkpoint's version is gone: again
  assert len(_versions(export_dir)) == 2 and _versions(export_dir)[0] == first


@pytest.mark.parametrize("bad", ["--hparams=batch_size=3", "--hparams=nonsense"])
def test_bad_hparams_are_errors(tmp_path, digits_dir, capsys, bad):
  message = _error(capsys, f"--data_dir={digits_dir}", f"--model_dir={tmp_path}/m", *TINY, bad)
  assert "--hparams" in message


@pytest.mark.slow
def test_warm_start_copies_the_weights_of_another_model(tmp_path, trained_model_dir, digits_dir):
  model_dir = str(tmp_path / "warm")
  assert _run(f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=1",
              "--steps_per_eval=1", *TINY, "--base_learning_rate=1e-12", "--weight_decay=0",
              f"--warm_start_from={trained_model_dir}") == 0
  name = "tiny/conv_bn/conv2d/kernel"
  source = tf.train.load_variable(trained_model_dir, name)
  warmed = tf.train.load_variable(model_dir, name)
  np.testing.assert_allclose(warmed, source, atol=1e-6)
  fresh_dir = str(tmp_path / "fresh")
  assert _run(f"--data_dir={digits_dir}", f"--model_dir={fresh_dir}", "--train_steps=1",
              "--steps_per_eval=1", *TINY, "--seed=2") == 0
  assert not np.allclose(tf.train.load_variable(fresh_dir, name), source, atol=1e-3)


def test_train_mode_makes_one_train_call_to_train_steps(tmp_path):
  calls = []

  class RecordingEstimator:
    def train(self, input_fn, max_steps, hooks=None, saving_listeners=None):
      calls.append(max_steps)

  config = tiny_config(tmp_path, train_steps=10, steps_per_eval=3)
  inputs = loop.Inputs(train_input_fn_at=lambda step: None, eval_input_fn=None, eval_steps=0,
                       num_eval_examples=0)
  loop.train_and_evaluate(RecordingEstimator(), config, inputs, evaluate_each=False)
  assert calls == [10]  # not 3, 6, 9, 10: one graph, one TPU compilation


def _first_labels(input_fn):
  return next(iter(input_fn({"batch_size": 16, "image_size": IMAGE_SIZE})))[1].numpy().tolist()


def test_each_cycle_of_a_seeded_run_reads_its_own_batches(tmp_path, digits_dir):
  config = tiny_config(tmp_path, train_steps=9, steps_per_eval=3, seed=7,
                       deterministic=True).replace("data", data_dir=str(digits_dir)).validate()
  config, info = assemble.resolve_data(config, need_train=True, need_eval=True)
  inputs = loop.make_inputs(config, info)
  firsts = {step: _first_labels(inputs.train_input_fn_at(step)) for step in (0, 3, 6)}
  assert len({tuple(labels) for labels in firsts.values()}) == 3  # not one cycle replayed
  assert _first_labels(inputs.train_input_fn_at(3)) == firsts[3]  # a resume there: the same
  assert _first_labels(inputs.train_input_fn) == firsts[0]

  started = []

  class RecordingEstimator:
    def train(self, input_fn, max_steps, hooks=None, saving_listeners=None):
      started.append((_first_labels(input_fn), max_steps))

    def evaluate(self, input_fn, steps, checkpoint_path=None, hooks=None):
      return {"global_step": started[-1][1], "accuracy": 0.5, "loss": 1.0}

  loop.train_and_evaluate(RecordingEstimator(), config, inputs, evaluate_each=True)
  assert started == [(firsts[0], 3), (firsts[3], 6), (firsts[6], 9)]
