"""The faults that end long runs: preemption, a damaged checkpoint, a full disk, a flaky store."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import _inproc_jax_cache
from absl import flags
from conftest import TINY_FLAGS
from conftest import program_env
from conftest import tiny_config
import contract_programs
import programs
import pytest
import small_disk
import tensorflow as tf

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import storage
from estimator_tpu.cli import train
from estimator_tpu.export import saved_model
from estimator_tpu.run import assemble
from estimator_tpu.run import checkpoints
from estimator_tpu.run import curves
from estimator_tpu.run import loop
from estimator_tpu.run import preemption

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = list(TINY_FLAGS)
PROGRAM_ENV = program_env(TF_CPP_MIN_LOG_LEVEL="3")
# The runs the damaged-checkpoint tests start from (conftest's trained_models: trained once).
FOUR_STEPS = ("--train_steps=4", "--steps_per_eval=2")


def _flags(*args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", *args])
  return flag_values


def _train(data_dir, model_dir, *args):
  return train.run(_flags(f"--data_dir={data_dir}", f"--model_dir={model_dir}", *TINY, *args))


def _files(directory):
  return sorted(os.path.relpath(os.path.join(root, name), directory)
                for root, dirs, names in os.walk(directory) for name in names + dirs)


def _leftovers(directory):
  return [name for name in _files(directory) if "_temp" in name or ".tmp" in name]


# --- preemption ----------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_exits_75_and_the_same_command_resumes(
    tmp_path, digits_dir):
  model_dir = str(tmp_path / "preempted")
  command = [sys.executable, "train.py", f"--data_dir={digits_dir}",
             f"--model_dir={model_dir}", "--train_steps=100000", "--steps_per_eval=100000",
             *TINY]
  process = programs.start(command, cwd=REPO, env=PROGRAM_ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  first = os.path.join(model_dir, "model.ckpt-0.index")
  deadline = time.time() + 120
  while not os.path.exists(first) and time.time() < deadline and process.poll() is None:
    time.sleep(0.2)
  time.sleep(3)  # training, with no checkpoint due for 100,000 steps
  process.send_signal(signal.SIGTERM)
  sent = time.time()
  out, err = process.communicate(timeout=60)
  took = time.time() - sent
  assert process.returncode == cli.EXIT_RETRY, err[-2000:]
  assert took < 30  # what a preemptible VM allows
  step = loop.current_step(model_dir)
  assert step > 0
  checkpoint = os.path.join(model_dir, f"model.ckpt-{step}")
  line = (f"preempted (SIGTERM) at step {step}: checkpoint saved to {checkpoint}; "
          "run the same command to resume")
  assert line in out
  assert "Traceback" not in err
  resumed = programs.run([*command[:4], f"--train_steps={step + 3}", *command[5:]],
                           cwd=REPO, env=PROGRAM_ENV, capture_output=True, text=True,
                           timeout=180)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f"resuming from step {step} in {model_dir}" in resumed.stdout
  assert loop.current_step(model_dir) == step + 3


class _SignalAt(tf.compat.v1.train.SessionRunHook):
  """Sends SIGTERM to this process after session run `at` of training or of evaluation."""

  def __init__(self, at=1, evaluating=False):
    self.at, self.evaluating, self.runs, self.sent = at, evaluating, 0, 0

  def begin(self):
    self._active = self.evaluating == any(v.op.name == "eval_step"
                                          for v in tf.compat.v1.local_variables())

  def after_run(self, run_context, run_values):
    if self._active:
      self.runs += 1
      if self.runs == self.at and not self.sent:
        self.sent += 1
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_sigterm_mid_evaluation_records_nothing_partial_and_resume_evaluates_it(
    tmp_path, digits_dir):
  config, info = assemble.prepare(
      tiny_config(str(tmp_path / "m"), train_steps=6, steps_per_eval=3).replace(
          "data", data_dir=digits_dir),
      None, need_train=True, need_eval=True)
  estimator = assemble.build(config)
  inputs = loop.make_inputs(config, info)
  signaller = _SignalAt(evaluating=True)
  with preemption.Watch() as watch, pytest.raises(preemption.Preempted) as stopped:
    loop.train_and_evaluate(estimator, config, inputs, watch=watch, hooks=[signaller])
  assert signaller.sent == 1
  assert (stopped.value.signal_name, stopped.value.step) == ("SIGTERM", 3)
  assert stopped.value.checkpoint == os.path.join(config.runtime.model_dir, "model.ckpt-3")
  assert curves.read_history(config.runtime.model_dir) == []  # the cut-short eval is not kept
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
  results = loop.train_and_evaluate(estimator, config, inputs)
  assert results["global_step"] == 6
  history = curves.read_history(config.runtime.model_dir)
  assert [h["step"] for h in history] == [3, 6]  # step 3's evaluation done on resume
  assert history[0]["num_eval_examples"] == info.num_eval_examples


def _train_until_signalled(config, info):
  """Trains config's run with SIGTERM sent at step 3, once; returns the Preempted raised."""
  signaller = _SignalAt(at=3)
  with preemption.Watch() as watch, pytest.raises(preemption.Preempted) as stopped:
    loop.train_and_evaluate(assemble.build(config), config, loop.make_inputs(config, info),
                            evaluate_each=False, watch=watch, hooks=[signaller])
  assert signaller.sent == 1
  return stopped.value


@pytest.mark.slow
def test_sigterm_on_the_jax_engine_saves_the_step_in_flight_and_resumes(tmp_path, digits_dir):
  if not contract_programs.HAS_JAX:
    pytest.skip(contract_programs.NO_JAX)
  config, info = assemble.prepare(
      tiny_config(str(tmp_path / "m"), train_steps=1000, steps_per_eval=1000).replace(
          "data", data_dir=digits_dir).replace("runtime", engine="jax", strategy="one_device"),
      None, need_train=True, need_eval=False)
  with _inproc_jax_cache.compiled_once(tmp_path / "jax_cache"):  # the resume's step: no recompile
    stopped = _train_until_signalled(config, info)
    step = stopped.step
    # The loop of iterations_per_loop=2 steps in flight finishes: step 3's loop ends at 4.
    assert step == 4 == loop.current_step(config.runtime.model_dir)
    assert stopped.checkpoint == os.path.join(config.runtime.model_dir, f"model.ckpt-{step}")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    resumed = assemble.build(config.replace("train", train_steps=6).validate())
    resumed.train(loop.make_inputs(config, info).train_input_fn, max_steps=6)
  assert loop.current_step(config.runtime.model_dir) == 6


@pytest.mark.slow
def test_sigterm_under_a_distribution_strategy_saves_the_step_in_flight(tmp_path, digits_dir):
  config, info = assemble.prepare(
      tiny_config(str(tmp_path / "m"), train_steps=1000, steps_per_eval=1000,
                  train_batch_size=16).replace("data", data_dir=digits_dir).replace(
                      "runtime", strategy="mirrored"), None, need_train=True, need_eval=False)
  stopped = _train_until_signalled(config, info)
  step = stopped.step
  assert 3 <= step <= 4 and step == loop.current_step(config.runtime.model_dir)  # of 1000
  assert stopped.checkpoint == os.path.join(config.runtime.model_dir, f"model.ckpt-{step}")


def test_sigterm_while_waiting_for_checkpoints_stops_eval_mode(tmp_path, trained_model_dir,
                                                               digits_dir, capsys):
  model_dir = shutil.copytree(trained_model_dir, str(tmp_path / "model"))
  timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
  timer.start()
  began = time.time()
  status = train.run(_flags(f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
                            "--mode=eval", "--train_steps=1000", "--eval_timeout_secs=600"))
  timer.join()
  assert status == cli.EXIT_RETRY
  assert time.time() - began < 60
  assert "preempted (SIGTERM) while evaluating" in capsys.readouterr().out


class _Stopped(Exception):
  """What a test's on_stop raises where the command line would exit."""


def _recording_on_stop(model_dir, calls):
  """An on_stop that records (signal, step, newest checkpoint's step on disk), then stops."""

  def on_stop(signal_name, step):
    newest = tf.train.latest_checkpoint(model_dir)
    calls.append((signal_name, step, checkpoints.restored_step(newest)))
    raise _Stopped()

  return on_stop


def _loop_under_watch(config, info, hooks, calls):
  estimator = assemble.build(config)
  inputs = loop.make_inputs(config, info)
  on_stop = _recording_on_stop(config.runtime.model_dir, calls)
  with preemption.Watch(on_stop=on_stop) as watch, pytest.raises(_Stopped):
    loop.train_and_evaluate(estimator, config, inputs, watch=watch, hooks=hooks)


def test_a_stop_in_training_hands_over_once_the_step_in_flight_is_on_disk(tmp_path, digits_dir):
  config, info = assemble.prepare(
      tiny_config(str(tmp_path / "m"), train_steps=1000, steps_per_eval=1000).replace(
          "data", data_dir=digits_dir), None, need_train=True, need_eval=True)
  calls = []
  _loop_under_watch(config, info, [_SignalAt(at=3)], calls)
  # Handed over with the step just saved, which is the newest checkpoint on disk.
  assert len(calls) == 1
  signal_name, step, on_disk = calls[0]
  assert signal_name == "SIGTERM" and 3 <= step <= 4 and on_disk == step


def test_a_stop_in_evaluation_hands_over_at_once_and_writes_no_eval_summary(tmp_path, digits_dir):
  config, info = assemble.prepare(
      tiny_config(str(tmp_path / "m"), train_steps=6, steps_per_eval=3).replace(
          "data", data_dir=digits_dir), None, need_train=True, need_eval=True)
  calls = []
  _loop_under_watch(config, info, [_SignalAt(evaluating=True)], calls)
  assert calls == [("SIGTERM", None, 3)]  # nothing to save: step 3 is on disk
  model_dir = config.runtime.model_dir
  assert curves.read_history(model_dir) == []
  assert tf.io.gfile.glob(os.path.join(model_dir, "eval", "events.*")) == []


def test_sigterm_while_exporting_leaves_no_version_and_the_same_command_exports(
    tmp_path, trained_model_dir, digits_dir, monkeypatch, capsys):
  model_dir = shutil.copytree(trained_model_dir, str(tmp_path / "model"))
  export_dir = str(tmp_path / "export")
  writes = []
  real_write = saved_model.warmup.write_warmup_requests

  def write_then_signal(*args, **kwargs):
    real_write(*args, **kwargs)
    writes.append(1)
    os.kill(os.getpid(), signal.SIGTERM)  # half-way: the version is staged, not published

  monkeypatch.setattr(saved_model.warmup, "write_warmup_requests", write_then_signal)
  args = [f"--data_dir={digits_dir}", f"--model_dir={model_dir}", "--train_steps=4",
          "--steps_per_eval=4", f"--export_dir={export_dir}"]
  assert train.run(_flags(*args)) == cli.EXIT_RETRY
  assert writes == [1]
  assert os.listdir(export_dir) == []  # no version, no staging directory
  assert (f"preempted (SIGTERM) while exporting; training is complete in {model_dir}: run the "
          "same command to export") in capsys.readouterr().out
  monkeypatch.setattr(saved_model.warmup, "write_warmup_requests", real_write)
  assert train.run(_flags(*args)) == 0
  assert [name for name in os.listdir(export_dir) if name.isdigit()] == os.listdir(export_dir)
  assert len(os.listdir(export_dir)) == 1


def test_second_sigint_interrupts_at_once():
  with preemption.Watch() as watch:
    os.kill(os.getpid(), signal.SIGINT)
    assert watch.signal_name == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)


# --- damaged checkpoints -----------------------------------------------------------


def _truncate_data(prefix):
  path = tf.io.gfile.glob(prefix + ".data-*")[0]
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 3)


def _garble_index(prefix):
  with open(prefix + ".index", "wb") as f:
    f.write(b"not an index")


@pytest.mark.parametrize("damage,reason", [
    (_truncate_data, "does not read (IndexError: Read less bytes than requested)"),
    (_garble_index, "its index does not read"),
])
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_older(
    tmp_path, digits_dir, trained_models, capsys, monkeypatch, damage, reason):
  monkeypatch.chdir(tmp_path)
  model_dir = "run"  # relative, as typed
  trained_models.copy(model_dir, *FOUR_STEPS)
  newest = os.path.join(model_dir, "model.ckpt-4")
  damaged_files = sorted(os.path.basename(p) for p in tf.io.gfile.glob(newest + ".*"))
  damage(newest)
  capsys.readouterr()
  assert _train(digits_dir, model_dir, "--train_steps=6", "--steps_per_eval=2") == 0
  out = capsys.readouterr().out
  assert f"checkpoint {newest} is damaged:" in out
  assert reason in out
  assert f"moved its files to {os.path.join(model_dir, 'damaged')}/" in out
  assert "resuming from step 2" in out
  assert "1 evaluation(s) after step 2 moved to run/damaged/eval_history.jsonl" in out
  assert sorted(os.listdir(os.path.join(model_dir, "damaged"))) == sorted(
      damaged_files + ["eval_history.jsonl"])  # kept
  assert [h["step"] for h in curves.read_history(os.path.join(model_dir, "damaged"))] == [4]
  assert [h["step"] for h in curves.read_history(model_dir)] == [2, 4, 6]
  assert loop.current_step(model_dir) == 6
  assert checkpoints.problem(os.path.join(model_dir, "model.ckpt-4")) is None  # saved anew


def test_no_restorable_checkpoint_stops_with_a_message_and_moves_nothing(
    tmp_path, digits_dir, trained_models, capsys):
  # The damaged-checkpoint run above's model dir (trained once): its checkpoints 0, 2 and 4.
  model_dir = trained_models.copy(str(tmp_path / "all_damaged"), *FOUR_STEPS)
  for prefix in checkpoints.candidates(model_dir):
    _truncate_data(prefix)
  before = _files(model_dir)
  capsys.readouterr()
  assert _train(digits_dir, model_dir, "--train_steps=6", "--steps_per_eval=2") == 2
  err = capsys.readouterr().err
  assert f"no checkpoint in --model_dir={model_dir} restores (3 damaged, left in place)" in err
  assert "use a new --model_dir" in err
  assert _files(model_dir) == before


@pytest.mark.slow
def test_eval_mode_and_export_skip_a_damaged_checkpoint_without_moving_it(
    tmp_path, digits_dir, trained_models, capsys):
  model_dir = trained_models.copy(str(tmp_path / "skip"), *FOUR_STEPS)
  newest = os.path.join(model_dir, "model.ckpt-4")
  _truncate_data(newest)
  capsys.readouterr()
  assert train.run(_flags(f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
                          "--mode=eval", "--train_steps=4", "--eval_timeout_secs=1")) == 0
  out = capsys.readouterr().out
  assert f"skipping damaged checkpoint {newest}: variable" in out
  assert "no new checkpoint" in out
  lines = []
  config, checkpoint = assemble.prepare_export(model_dir, str(tmp_path / "export"),
                                               report=lines.append)
  assert checkpoint == os.path.join(model_dir, "model.ckpt-2")
  assert len(lines) == 1 and lines[0].startswith(f"skipping damaged checkpoint {newest}")
  assert os.path.exists(newest + ".index")  # only the trainer sets files aside


@pytest.mark.slow
def test_newest_restorable_finds_checkpoints_when_the_state_file_is_lost(tmp_path,
                                                                         trained_models):
  model_dir = trained_models.copy(str(tmp_path / "no_state"), *FOUR_STEPS)
  os.remove(os.path.join(model_dir, "checkpoint"))
  assert checkpoints.newest_restorable(model_dir) == os.path.join(model_dir, "model.ckpt-4")


def test_discard_unfinished_removes_temp_files_and_unlisted_newer_checkpoints(tmp_path):
  model_dir = str(tmp_path)
  keep = ["model.ckpt-2.index", "model.ckpt-2.data-00000-of-00001", "model.ckpt-2.meta",
          "graph.pbtxt", "config.json"]
  drop = ["model.ckpt-4.index", "model.ckpt-4.data-00000-of-00001",
          "model.ckpt-4.meta.tmp" + "a" * 32, "graph.pbtxt.tmp" + "0" * 32,
          "eval_history.jsonl.tmp-" + "b" * 32]
  for name in keep + drop:
    (tmp_path / name).write_bytes(b"x")
  (tmp_path / "model.ckpt-4_temp").mkdir()
  (tmp_path / "model.ckpt-4_temp" / "part-00000-of-00001.index").write_bytes(b"x")
  tf.compat.v1.train.update_checkpoint_state(model_dir, os.path.join(model_dir, "model.ckpt-2"))
  removed = checkpoints.discard_unfinished(model_dir)
  assert sorted(os.path.basename(p) for p in removed) == sorted(drop + ["model.ckpt-4_temp"])
  assert sorted(os.listdir(model_dir)) == sorted(keep + ["checkpoint"])


# --- a full disk -----------------------------------------------------------------


@pytest.fixture
def disk():
  made = []

  def make(size_bytes):
    made.append(small_disk.SmallDisk(size_bytes))
    return made[-1]

  yield make
  for d in made:
    d.close()


def _run_program(argv):
  return programs.run(argv, cwd=REPO, env=PROGRAM_ENV, capture_output=True, text=True,
                        timeout=300)


@pytest.mark.slow
def test_full_disk_in_training_is_one_line_leaves_nothing_unfinished_and_resumes(
    disk, digits_dir):
  d = disk(50_000_000)
  model_dir = os.path.join(d.directory, "model")
  argv = ["train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}", *TINY,
          "--steps_per_eval=10", "--mode=train"]
  assert _run_program(d.command([*argv, "--train_steps=10"])).returncode == 0
  d.fill(leave_bytes=20_000)  # less than one more checkpoint takes
  full = _run_program(d.command([*argv, "--train_steps=60"]))
  assert full.returncode == cli.EXIT_NO_SPACE, full.stderr[-2000:]
  lines = full.stderr.strip().splitlines()
  assert len(lines) == 1, full.stderr[-2000:]
  assert lines[0].startswith(
      f"train.py: error: no space left on device writing under --model_dir={model_dir}; "
      "it needs about ")
  assert lines[0].endswith("the newest checkpoint, step 10, is intact: free space, then run "
                           "the same command to resume from it")
  assert _leftovers(model_dir) == []
  newest = checkpoints.newest_restorable(model_dir, fix=False)
  assert newest == os.path.join(model_dir, "model.ckpt-10")
  assert checkpoints.problem(newest) is None
  d.unfill()
  resumed = _run_program(d.command([*argv, "--train_steps=20"]))
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "resuming from step 10" in resumed.stdout
  assert loop.current_step(model_dir) == 20


@pytest.mark.slow
def test_full_disk_in_preprocess_keeps_no_manifest_and_names_output_dir(disk, tmp_path):
  images = str(tmp_path / "images")
  programs.run([sys.executable, "-m", "estimator_tpu.data.digits", "digits", images,
                  "--limit=300"], cwd=REPO, env=PROGRAM_ENV, check=True, capture_output=True)
  d = disk(50_000_000)
  d.fill(leave_bytes=60_000)
  output_dir = os.path.join(d.directory, "data")
  done = _run_program(d.command(["preprocess.py", f"--input_dir={images}",
                                 f"--output_dir={output_dir}"]))
  assert done.returncode == 2
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr[-2000:]
  assert lines[0].startswith(
      f"preprocess.py: error: no space left on device writing under --output_dir={output_dir}")
  assert not os.path.exists(os.path.join(output_dir, "manifest.json"))
  assert not os.path.exists(output_dir) or os.listdir(output_dir) == []


@pytest.mark.slow
def test_full_disk_in_export_leaves_no_version(disk, trained_model_dir):
  d = disk(50_000_000)
  d.fill(leave_bytes=40_000)
  export_dir = os.path.join(d.directory, "export")
  done = _run_program(d.command(["export.py", f"--model_dir={trained_model_dir}",
                                 f"--export_dir={export_dir}"]))
  assert done.returncode == cli.EXIT_NO_SPACE, done.stderr[-2000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, done.stderr[-2000:]
  assert lines[0].startswith(
      f"export.py: error: no space left on device writing under --export_dir={export_dir}; ")
  assert "no version was left in --export_dir" in done.stderr
  assert _files(export_dir) == []


# --- transient storage errors ------------------------------------------------------


class FlakyFiles:
  """tf.io.gfile whose first `failures` calls raise UnavailableError (a store's hiccup)."""

  def __init__(self, failures, error=tf.errors.UnavailableError):
    self.failures = failures
    self.calls = 0
    self._error = error

  def _call(self, name, *args, **kwargs):
    self.calls += 1
    if self.calls <= self.failures:
      raise self._error(None, None, f"{name} {args[0]}: connection reset")
    return getattr(tf.io.gfile, name)(*args, **kwargs)

  def __getattr__(self, name):
    return lambda *args, **kwargs: self._call(name, *args, **kwargs)


@pytest.fixture
def no_sleep(monkeypatch):
  slept = []
  monkeypatch.setattr(storage, "sleep", slept.append)
  return slept


def test_transient_errors_are_retried_with_backoff(tmp_path, monkeypatch, no_sleep):
  config = tiny_config(str(tmp_path))
  config_lib.write_config(config)
  flaky = FlakyFiles(failures=2)
  monkeypatch.setattr(storage, "gfile", flaky)
  assert config_lib.read_config(str(tmp_path)) == config
  assert no_sleep == [1.0, 2.0]
  assert flaky.calls == 4  # exists failed twice, then exists and the read


def test_a_persisting_transient_error_names_the_path_and_asks_to_rerun(tmp_path, monkeypatch,
                                                                       no_sleep):
  curves.append_history(str(tmp_path), {"step": 1, "accuracy": 0.5})
  monkeypatch.setattr(storage, "gfile", FlakyFiles(failures=100))
  with pytest.raises(storage.StorageError) as raised:
    curves.read_history(str(tmp_path))
  path = os.path.join(str(tmp_path), curves.HISTORY_FILE)
  assert str(raised.value).startswith(f"checking {path} failed 4 times with a transient error")
  assert no_sleep == [1.0, 2.0, 4.0]
  message, status = cli.storage_failure(raised.value, str(tmp_path), "--model_dir")
  assert status == cli.EXIT_RETRY and path in message


def test_other_errors_are_not_retried(tmp_path, monkeypatch, no_sleep):
  flaky = FlakyFiles(failures=1, error=tf.errors.PermissionDeniedError)
  monkeypatch.setattr(storage, "gfile", flaky)
  with pytest.raises(tf.errors.PermissionDeniedError):
    storage.read_text(str(tmp_path / "x"))
  assert (flaky.calls, no_sleep) == (1, [])


class FullDisk(FlakyFiles):
  """tf.io.gfile on a disk with `room` bytes free: a write stores that many bytes, then fails."""

  def __init__(self, room):
    super().__init__(failures=0)
    self.room = room

  def GFile(self, name, mode="r"):  # noqa: N802 - tf.io.gfile's name
    real = tf.io.gfile.GFile(name, mode)
    if "w" not in mode:
      return real
    disk = self

    class Filling:
      def __enter__(self):
        return self

      def __exit__(self, *exc):
        real.close()

      def write(self, data):
        fits = data[:disk.room]
        real.write(fits)
        real.flush()
        disk.room -= len(fits)
        if len(fits) < len(data):
          raise OSError(errno.ENOSPC, "No space left on device", name)

      def close(self):
        real.close()

    return Filling()


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
  path = str(tmp_path / "eval_history.jsonl")
  storage.write_atomically(path, "old\n")
  disk = FullDisk(room=100)
  monkeypatch.setattr(storage, "gfile", disk)
  with pytest.raises(OSError) as raised:
    storage.write_atomically(path, "new\n" * 1000)
  assert disk.room == 0  # the disk filled up mid-write, after 100 bytes
  assert storage.no_space(raised.value)
  assert open(path).read() == "old\n"
  assert os.listdir(tmp_path) == ["eval_history.jsonl"]


def test_storage_failure_maps_each_fault_to_its_exit_status(tmp_path):
  nospace = tf.errors.ResourceExhaustedError(None, None, "/m/x.meta; No space left on device")
  message, status = cli.storage_failure(nospace, str(tmp_path), "--model_dir", 2048)
  assert status == cli.EXIT_NO_SPACE
  assert message.startswith(f"no space left on device writing under --model_dir={tmp_path}; "
                            "it needs about 2.0 KB; ")
  unavailable = tf.errors.UnavailableError(None, None, "gs://b/m/x: 503 backend error")
  wrapped = RuntimeError("estimator failed")
  wrapped.__cause__ = unavailable
  message, status = cli.storage_failure(wrapped, "gs://b/m", "--model_dir")
  assert status == cli.EXIT_RETRY
  assert "gs://b/m/x: 503 backend error" in message
  assert cli.storage_failure(ValueError("a bug"), str(tmp_path), "--model_dir") is None
