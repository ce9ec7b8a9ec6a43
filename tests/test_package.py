"""The package's face: the public API, the installed commands, and the old module paths."""

import os
import subprocess
import sys
import warnings

from conftest import program_env
import pytest

import estimator_tpu

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_public_api_names_what_users_import():
  from estimator_tpu.data import input_pipeline
  from estimator_tpu.engines import choose as tpu_estimator
  from estimator_tpu.export import saved_model
  from estimator_tpu.model import model_fn
  from estimator_tpu.run import loop
  from estimator_tpu.tpu import preflight
  assert estimator_tpu.make_input_fn is input_pipeline.make_input_fn
  assert estimator_tpu.model_fn is model_fn.model_fn
  assert estimator_tpu.build_estimator is tpu_estimator.build_estimator
  assert estimator_tpu.train_and_evaluate is loop.train_and_evaluate
  assert estimator_tpu.export_saved_model is saved_model.export_saved_model
  assert estimator_tpu.preflight is preflight.run_checks
  assert estimator_tpu.stacks.estimator.tpu.TPUEstimator
  assert set(estimator_tpu.__all__) <= set(dir(estimator_tpu))
  with pytest.raises(AttributeError, match="has no attribute 'nope'"):
    estimator_tpu.nope  # noqa: B018 -- the attribute access is what raises


def test_old_module_path_warns_and_gives_the_new_module():
  sys.modules.pop("estimator_tpu.preprocessing", None)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from estimator_tpu import preprocessing
  from estimator_tpu.data import image_ops
  assert preprocessing is image_ops
  assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == [
      "estimator_tpu.preprocessing moved to estimator_tpu.data.image_ops; the old path goes "
      "away in the next release"]


def test_old_digits_command_still_runs(tmp_path):
  done = subprocess.run([sys.executable, "-m", "estimator_tpu.datasets", "digits", str(tmp_path),
                         "--limit=20"],
                        capture_output=True, text=True, cwd=REPO, timeout=300, env=program_env())
  assert done.returncode == 0, done.stderr
  assert "moved to estimator_tpu.data.digits" in done.stderr
  assert len(list(tmp_path.glob("*/*.jpg"))) == 20


# absl's --helpfull lists every flag and exits 1; argparse's --help exits 0.
@pytest.mark.parametrize("command,help_flag,code,says", [
    ("estimator-tpu-train", "--helpfull", 1, ["--train_steps", "--[no]preflight", "--[no]use_tpu"]),
    ("estimator-tpu-export", "--helpfull", 1, ["--export_dir", "--model_dir"]),
    ("estimator-tpu-preprocess", "--helpfull", 1, ["--input_dir", "--output_dir"]),
    ("estimator-tpu-predict", "--help", 0, ["--saved_model", "--input"])])
def test_installed_commands_list_their_flags(command, help_flag, code, says, tmp_path):
  path = os.path.join(BIN, command)
  assert os.path.exists(path), f"{path}: run make install (pip install -e .)"
  done = subprocess.run([path, help_flag], capture_output=True, text=True, timeout=300,
                        cwd=str(tmp_path), env=program_env(TF_CPP_MIN_LOG_LEVEL="3"))
  assert done.returncode == code, done.stderr
  for flag in says:
    assert flag in done.stdout + done.stderr
