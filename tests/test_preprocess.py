"""End-to-end tests of preprocess.py, run as a user runs it (a subprocess)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import weakref

from absl import flags
import conftest
from conftest import program_env
import programs
import pytest
import tensorflow as tf

from estimator_tpu.beam import options
from estimator_tpu.cli import preprocess
from estimator_tpu.data import schema

# CI runs these end-to-end runs on the default stack only (README, "Tests").
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPROCESS = os.path.join(ROOT, "preprocess.py")


def _start(*args, fresh=False):
  return programs.start([sys.executable, PREPROCESS, *args], cwd=ROOT, fresh=fresh,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True, env=program_env())


def _finish(proc):
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


def _run(*args):
  return _finish(_start(*args))


def _error_line(err):
  """The single `preprocess.py: error:` line of stderr (TF may log more)."""
  lines = [line for line in err.splitlines() if line.startswith("preprocess.py: ")]
  assert len(lines) == 1, err
  return lines[0]


@pytest.fixture(scope="module")
def first_run(image_folder, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("e2e") / "data")
  code, stdout, stderr = _run(f"--input_dir={image_folder}",
                              f"--output_dir={out}", "--num_shards=2",
                              "--validation_fraction=0.25")
  assert code == 0, stderr
  return out, stdout


def test_writes_a_complete_dataset_and_a_summary(first_run):
  out, stdout = first_run
  with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  train, validation = manifest["splits"]["train"], manifest["splits"][
      "validation"]
  assert train["count"] + validation["count"] == 27
  assert manifest["rejected"]["count"] == 4
  assert manifest["labels"] == conftest.IMAGE_FOLDER_CLASSES
  assert manifest["flags"]["num_shards"] == 2
  assert manifest["flags"]["pipeline_args"] == []
  assert sorted(os.listdir(out)) == sorted(
      ["labels.txt", "manifest.json", "rejected.csv"]
      + train["shards"] + validation["shards"])
  assert f"  train       {train['count']:>9,} images in 2 shard(s)" in stdout
  assert "rejected            4  (see rejected.csv)" in stdout
  assert f"output      {out}" in stdout
  dataset = tf.data.TFRecordDataset(
      [os.path.join(out, n) for n in train["shards"]]).map(
          schema.parse_example)
  labels = [int(r["label"]) for r in dataset]
  assert len(labels) == train["count"] and set(labels) == {0, 1, 2}


@pytest.fixture(scope="module")
def error_runs(first_run, image_folder, tmp_path_factory):
  """Every failing invocation at once (each pays TensorFlow's import)."""
  tmp = tmp_path_factory.mktemp("errors")
  junk = tmp / "junk" / "cat"
  os.makedirs(junk)
  (junk / "a.jpg").write_text("not an image")
  cases = {
      "missing": ([f"--input_dir={tmp}/nope", f"--output_dir={tmp}/o1"],
                  f"--input_dir={tmp}/nope does not exist", f"{tmp}/o1"),
      "both": ([f"--input_dir={image_folder}", f"--input_csv={tmp}/x.csv",
                f"--output_dir={tmp}/o2"], "give exactly one of", f"{tmp}/o2"),
      "neither": ([f"--output_dir={tmp}/o3"], "(got neither)", f"{tmp}/o3"),
      "no_images": ([f"--input_dir={tmp}/junk", f"--output_dir={tmp}/o4"],
                    "no valid image among 1 inputs", f"{tmp}/o4"),
      "existing": ([f"--input_dir={image_folder}",
                    f"--output_dir={first_run[0]}"],
                   f"--output_dir={first_run[0]} already holds a dataset "
                   "(manifest.json); pass --overwrite", None),
      "typo": ([f"--input_dir={image_folder}", f"--output_dir={tmp}/o5",
                "--validation_fractoin=0.5"],
               "unknown flag --validation_fractoin: neither a preprocess.py "
               "flag nor a Beam pipeline option; did you mean "
               "--validation_fraction?", f"{tmp}/o5"),
      "fraction": ([f"--input_dir={image_folder}", f"--output_dir={tmp}/o6",
                    "--validation_fraction=2"],
                   "--validation_fraction=2.0 must be >= 0 and < 1",
                   f"{tmp}/o6"),
      "dask_option": ([f"--input_dir={image_folder}", f"--output_dir={tmp}/o7",
                       "--dask_client_address=tcp://127.0.0.1:8786"],
                      "--dask_client_address is an option of the DaskRunner; "
                      "add --runner=DaskRunner", f"{tmp}/o7"),
  }
  procs = {name: _start(*args) for name, (args, _, _) in cases.items()}
  return {name: (_finish(proc), cases[name][1], cases[name][2])
          for name, proc in procs.items()}


@pytest.mark.parametrize("case", ["missing", "both", "neither", "no_images",
                                  "existing", "typo", "fraction", "dask_option"])
def test_errors_exit_2_with_one_line_and_write_nothing(error_runs, case):
  (code, stdout, stderr), message, output_dir = error_runs[case]
  assert code == 2, stderr
  line = _error_line(stderr)
  assert line.startswith("preprocess.py: error: ") and message in line
  assert "done" not in stdout
  if output_dir:
    assert not os.path.exists(output_dir)


def test_existing_dataset_is_left_alone(error_runs, first_run):
  del error_runs  # Ran against first_run's output.
  with open(os.path.join(first_run[0], "manifest.json"), encoding="utf-8") as f:
    assert json.load(f)["flags"]["num_shards"] == 2


def test_overwrite_replaces_the_dataset(image_folder, tmp_path):
  out = str(tmp_path / "data")
  os.makedirs(out)
  for name in ("manifest.json", "train-00000-of-00009.tfrecord", "mine.txt"):
    with open(os.path.join(out, name), "w") as f:
      f.write("old")
  code, _, stderr = _run(f"--input_dir={image_folder}", f"--output_dir={out}",
                         "--overwrite", "--validation_fraction=0",
                         "--direct_num_workers=1")
  assert code == 0, stderr
  assert sorted(os.listdir(out)) == [
      "labels.txt", "manifest.json", "mine.txt", "rejected.csv",
      "train-00000-of-00001.tfrecord"]
  with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  assert manifest["splits"]["train"]["count"] == 27
  assert manifest["flags"]["pipeline_args"] == ["--direct_num_workers=1"]


def test_default_beam_options_use_every_core_with_threads():
  assert options.with_defaults([]) == [
      "--default_sdk_harness_log_level=ERROR", "--direct_num_workers=0",
      "--direct_running_mode=multi_threading"]
  for given in (["--runner=DataflowRunner"], ["--runner", "FlinkRunner"],
                ["--direct_running_mode=multi_processing"]):
    assert options.with_defaults(given)[:len(given)] == given
    assert "--direct_num_workers=0" not in options.with_defaults(
        given)


def test_beam_options_pass_and_typos_do_not():
  flag_values = flags.FlagValues()
  options.define_flags(flag_values)
  beam_args = ["--runner", "DataflowRunner", "--project=p", "--region=r",
               "--temp_location=gs://b/tmp", "--num_workers=8",
               "--flink_master=localhost:8081", "--direct_num_workers=2"]
  assert options.unknown_args(beam_args, flag_values) == []
  assert options.unknown_args(["--max_sise=9"], flag_values) == [
      "unknown flag --max_sise: neither a preprocess.py flag nor a Beam "
      "pipeline option; did you mean --max_size?"]


def test_dask_runner_by_its_short_name_with_its_options():
  flag_values = flags.FlagValues()
  options.define_flags(flag_values)
  dask_args = ["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:8786",
               "--dask_connection_timeout=30"]
  assert options.unknown_args(dask_args, flag_values) == []
  assert options.unknown_args(["--runner", "DaskRunner", "--dask_npartitions=4"],
                              flag_values) == []
  assert options.unknown_args(["--runner=DaskRunner", "--dask_adress=x"], flag_values) == [
      "unknown flag --dask_adress: neither a preprocess.py flag nor a Beam pipeline option; "
      "did you mean --dask_client_address?"]
  assert options.with_defaults(dask_args) == [
      "--runner=" + options.DASK_RUNNER, *dask_args[1:],
      "--default_sdk_harness_log_level=ERROR", "--dask_npartitions=8"]
  assert options.with_defaults(["--runner", "DaskRunner", "--dask_partition_size=4"]) == [
      "--runner", options.DASK_RUNNER, "--dask_partition_size=4",
      "--default_sdk_harness_log_level=ERROR"]


@pytest.fixture(scope="module")
def digit_photos(tmp_path_factory):
  """1,797 digit JPEGs in class folders: a run long enough to stop halfway."""
  folder = str(tmp_path_factory.mktemp("digit_photos"))
  done = programs.run([sys.executable, "-m", "estimator_tpu.data.digits", "digits", folder],
                        cwd=ROOT, capture_output=True, text=True, env=program_env(), timeout=300)
  assert done.returncode == 0, done.stderr
  return folder


def _temp_dirs(output_dir):
  if not os.path.isdir(output_dir):
    return []
  return [name for name in os.listdir(output_dir) if name.startswith(".preprocess-temp-")]


def _running(output_dir):
  """Whether the run has started its pipeline (written the command into its temporary folder)."""
  return any(os.path.getsize(os.path.join(output_dir, name, "command.txt")) > 0
             for name in _temp_dirs(output_dir)
             if os.path.exists(os.path.join(output_dir, name, "command.txt")))


@pytest.mark.parametrize("signal_name,says", [("SIGINT", "interrupted (Ctrl-C)"),
                                              ("SIGTERM", "preempted (SIGTERM)")])
def test_a_stopped_run_says_one_line_exits_75_and_the_same_command_starts_again(
    digit_photos, tmp_path, signal_name, says):
  out = str(tmp_path / "data")
  command = (f"--input_dir={digit_photos}", f"--output_dir={out}")
  proc = _start(*command, fresh=True)  # all it prints is checked, start-up included
  deadline = time.time() + 240
  while not _running(out) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.1)
  assert proc.poll() is None, "the run ended before it could be stopped"
  proc.send_signal(getattr(signal, signal_name))
  code, stdout, stderr = _finish(proc)
  assert code == 75, stderr
  assert stderr == ""
  assert stdout.strip().splitlines() == [
      f"preprocess.py: {says}; --output_dir={out} holds no dataset yet (no manifest.json): "
      "run the same command to start again"]
  assert not os.path.exists(os.path.join(out, "manifest.json"))
  [temp] = _temp_dirs(out)
  with open(os.path.join(out, temp, "command.txt")) as f:
    assert f.read() == f"python preprocess.py {' '.join(command)}\n"
  from estimator_tpu import config as config_lib
  from estimator_tpu.data import data_dir
  with pytest.raises(config_lib.ConfigError, match="finish it with the command that started "
                     f"it: python preprocess.py --input_dir={digit_photos} --output_dir={out}$"):
    data_dir.resolve(config_lib.DataConfig(data_dir=out))  # not trained on
  code, stdout, stderr = _run(*command)
  assert code == 0, stderr
  if _temp_dirs(out):
    raise AssertionError(f"temporary output left in {out}")
  assert "already holds a dataset" not in stdout + stderr
  with open(os.path.join(out, "manifest.json")) as f:
    assert json.load(f)["images"]["count"] == 1797


def test_progress_shows_images_encoded_and_rejected_when_asked(image_folder, tmp_path):
  proc = programs.start([sys.executable, PREPROCESS, f"--input_dir={image_folder}",
                           f"--output_dir={tmp_path / 'data'}"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=program_env(ESTIMATOR_TPU_PROGRESS_SECS="0.001"))
  code, stdout, stderr = _finish(proc)
  assert code == 0, stderr
  lines = [line for line in stdout.splitlines() if " images | " in line]
  assert lines, stdout
  assert re.fullmatch(r"preprocess\.py: \d+/\d+ images \| \d+ encoded, \d+ rejected \| "
                      r"\d+ images/s( \| \d+s left)?", lines[-1]), lines[-1]


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_landing_where_python_ignores_exceptions_still_stops_the_run(capfd, signal_name):
  # A signal whose handler runs inside a weakref callback: Python prints the exception it raises
  # ("Exception ignored in ...") and goes on. The run must stop all the same, quietly.
  def callback(unused_ref):
    signal.raise_signal(getattr(signal, signal_name))
    sum(range(1000))  # the handler runs here, inside the callback

  class Thing:
    pass

  before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.unraisablehook)
  started = time.monotonic()
  with pytest.raises(preprocess.Interrupted) as stopped:
    with preprocess._interruptible():  # pylint: disable=protected-access
      thing = Thing()
      ref = weakref.ref(thing, callback)
      del thing
      time.sleep(10)  # interrupted, not slept to the end
  assert stopped.value.signal_name == signal_name
  assert time.monotonic() - started < 5
  assert ref() is None
  assert capfd.readouterr().err == ""
  # Outside the block the handlers and the unraisable hook are as before.
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
          sys.unraisablehook) == before


def test_a_stopped_runs_leftovers_are_no_dataset(tmp_path):
  from estimator_tpu.beam import sources
  out = tmp_path / "data"
  (out / ".preprocess-temp-abc").mkdir(parents=True)
  (out / ".preprocess-temp-abc" / "train-00000-part").write_bytes(b"x")
  (out / "train-00000-of-00001.tfrecord").write_bytes(b"x")
  said = []
  assert sources.check_output_dir(str(out), overwrite=False, report=said.append)
  assert os.listdir(out) == []
  assert len(said) == 1 and "holds what a stopped run left" in said[0]
  (out / "train-00000-of-00001.tfrecord").write_bytes(b"x")  # no temporary folder: a dataset
  with pytest.raises(sources.InputError, match="already holds a dataset"):
    sources.check_output_dir(str(out), overwrite=False)
