"""The package's face: the public API, the installed commands, and the old module paths."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import warnings
import zipfile

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


# Each command's own flags, with a piece of their help text: --help lists them first.
OWN_FLAGS = {
    "train": [("--data_dir", "A preprocess.py output directory"),
              ("--train_steps", "Total training steps"), ("--[no]preflight", "PASS/WARN/FAIL"),
              ("--[no]use_tpu", "Run on Cloud TPU"), ("--model_dir", "Where checkpoints")],
    "export": [("--model_dir", "The trained model's directory"),
               ("--export_dir", "numeric version")],
    "preprocess": [("--input_dir", "Folder of class sub-folders"),
                   ("--output_dir", "Where the shards"), ("--num_shards", "Shards per split")],
    "predict": [("--saved_model", "an export version dir"), ("--input", "folder, glob")],
}
SCRIPTS = {"train": ["train.py"], "export": ["export.py"], "preprocess": ["preprocess.py"],
           "predict": ["-m", "serving.predict"]}
INSTALLED = {"train": "estimator-tpu-train", "export": "estimator-tpu-export",
             "preprocess": "estimator-tpu-preprocess", "predict": "estimator-tpu-predict"}


def _command(name, installed):
  if installed:
    path = os.path.join(BIN, INSTALLED[name])
    assert os.path.exists(path), f"{path}: run make install (pip install -e .)"
    return [path]
  return [sys.executable, *SCRIPTS[name]]


def _run(argv, **env):
  return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                        env=program_env(TF_CPP_MIN_LOG_LEVEL="3", **env))


@pytest.mark.parametrize("installed", [False, True], ids=["script", "installed"])
@pytest.mark.parametrize("name", sorted(OWN_FLAGS))
def test_help_lists_the_commands_own_flags_first_with_their_help(name, installed):
  done = _run([*_command(name, installed), "--help"])
  assert done.returncode == 0, done.stderr
  assert done.stderr == ""
  out = done.stdout
  assert "Try --helpfull" not in out
  lines = out.splitlines()
  for flag, help_text in OWN_FLAGS[name]:
    line = next((line for line in lines if line.strip().startswith(flag)), None)
    assert line is not None, f"{flag} not in {out}"
    at = out.index(line)
    assert help_text in out[at:at + 400], f"{flag}: no {help_text!r} after it in {out}"
  if name != "predict":  # absl's own flags come last, if at all
    first_own = min(out.index(flag) for flag, _ in OWN_FLAGS[name])
    assert out.find("logtostderr") == -1 or out.find("logtostderr") > first_own


def _defined_flags(name):
  """The flags `name` defines: each must be listed by its --help, once."""
  from absl import flags
  if name == "predict":
    from estimator_tpu.serving import predict
    return {option[2:] for action in predict.build_parser()._actions  # noqa: SLF001
            for option in action.option_strings if option.startswith("--")} - {"help"}
  if name == "preprocess":
    from estimator_tpu.beam import options
    return set(options.FLAG_NAMES)
  flag_values = flags.FlagValues()
  if name == "train":
    from estimator_tpu import flags as flags_lib
    from estimator_tpu.cli import train
    flags_lib.define_flags(flag_values)
    train.define_entry_flags(flag_values)
  else:
    from estimator_tpu.cli import export
    export.define_flags(flag_values)
  return {flag_name for flag_name in flag_values if flag_values[flag_name].name == flag_name}


def _listed_flags(out, name):
  """{flag: its help text} from --help: absl's `  --[no]flag: help` or argparse's entries."""
  if name == "predict":
    pattern = r"^  --(\w+)(?: [A-Z_]+)?(?:\s+(\S.*))?$"
  else:
    pattern = r"^  --(?:\[no\])?(\w+): (.*)$"
    out = out.split("absl's own flags")[0]
  listed = {}
  for flag, help_text in re.findall(pattern, out, re.MULTILINE):
    assert flag not in listed, f"--{flag} listed twice in {out}"
    listed[flag] = help_text
  return listed


@pytest.mark.parametrize("name", sorted(OWN_FLAGS))
def test_help_lists_every_flag_of_the_command_with_help_text(name):
  done = _run([sys.executable, *SCRIPTS[name], "--help"])
  assert done.returncode == 0, done.stderr
  listed = _listed_flags(done.stdout, name)
  assert set(listed) == _defined_flags(name)
  if name == "predict":  # argparse puts a long flag's help on the next line
    lines = done.stdout.splitlines()
    for flag in listed:
      at = next(i for i, line in enumerate(lines) if line.startswith(f"  --{flag}"))
      assert listed[flag] or lines[at + 1].startswith(" " * 10), f"--{flag} has no help"
  else:
    assert all(len(text) > 10 for text in listed.values()), listed


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_answers_before_tensorflow_is_imported(name):
  done = _run([sys.executable, "-X", "importtime", *SCRIPTS[name], "--help"])
  assert done.returncode == 0, done.stderr[-2000:]
  imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
              if line.startswith("import time:")}
  assert "tensorflow" not in imported and "apache_beam" not in imported


def test_helpfull_adds_absls_flags():
  done = _run([sys.executable, "train.py", "--helpfull"])
  assert done.returncode == 0, done.stderr
  assert done.stdout.index("--train_steps") < done.stdout.index("--[no]logtostderr")


@pytest.mark.parametrize("argv,says", [
    (["train.py", "--image_sise=32"], "train.py: error: unknown flag --image_sise; "
                                      "did you mean --image_size?"),
    (["train.py", "--nouse_tpuu"], "did you mean --nouse_tpu?"),
    (["train.py", "--train_steps=many"], "flag --train_steps=many: "),
    (["train.py", "stray"], "unexpected arguments ['stray']"),
    (["export.py", "--exprot=x"], "export.py: error: unknown flag --exprot; "
                                  "did you mean --export_dir?"),
    (["export.py", "--image_size=32"], "unknown flag --image_size"),
    (["preprocess.py", "--num_shard=2"], "did you mean --num_shards?"),
    (["-m", "serving.predict", "--saved_modl=x"], "python -m serving.predict: error: unknown "
                                                  "flag --saved_modl; did you mean --saved_model?"),
])
def test_a_bad_flag_exits_2_naming_the_nearest(argv, says):
  done = _run([sys.executable, *argv])
  assert done.returncode == 2, done.stderr
  assert says in done.stderr
  assert len(done.stderr.strip().splitlines()) == 1, done.stderr
  assert "Traceback" not in done.stderr and "FATAL" not in done.stderr


def test_an_installed_command_calls_itself_by_its_name():
  done = _run([os.path.join(BIN, "estimator-tpu-predict"), "--saved_modl=x"])
  assert done.returncode == 2
  assert done.stderr.startswith("estimator-tpu-predict: error: unknown flag --saved_modl")


def test_the_wheel_installs_one_package_with_its_data_and_commands(tmp_path):
  """What `pip install .` puts at the top of site-packages: estimator_tpu and its dist-info.

  Built from a copy of the checkout, all but what .gitignore leaves out (venvs, `make demo`'s
  output, build outputs, caches) and git's store: setuptools writes build/ and the egg-info
  where it builds, and test_beam_package.py, on another worker meanwhile, checks that the
  checkout has no build/.
  """
  source = tmp_path / "checkout"
  shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
      ".venv*", ".git", "demo_output*", "build", "dist", "*.egg-info", "__pycache__",
      ".*_cache"))
  wheels = tmp_path / "wheels"
  done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                         "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                         "--wheel-dir", str(wheels), str(source)],
                        capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
  assert done.returncode == 0, done.stderr
  [wheel] = list(wheels.glob("*.whl"))
  archive = zipfile.ZipFile(wheel)
  names = archive.namelist()
  assert {name.split("/")[0] for name in names} == {"estimator_tpu",
                                                    "estimator_tpu-0.1.0.dist-info"}
  for data in ("estimator_tpu/serving/models.config",
               "estimator_tpu/serving/batching_parameters.txt", "estimator_tpu/tpu/tpu_ops.txt"):
    assert data in names
  entry_points = archive.read("estimator_tpu-0.1.0.dist-info/entry_points.txt").decode()
  for command, target in (("estimator-tpu-train", "estimator_tpu.cli.train:main"),
                          ("estimator-tpu-predict", "estimator_tpu.serving.predict:main")):
    assert f"{command} = {target}" in entry_points


def test_every_dependency_is_a_range_that_each_lock_pins():
  """[project] dependencies are ranges (never ==); every lock pins a version inside each."""
  from packaging.requirements import Requirement
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  # The locks' TensorFlow builds provide the `tensorflow` package under another name.
  provides = {"tensorflow-cpu": "tensorflow", "tensorflow-tpu": "tensorflow"}
  for stack, python in (("current", "3.12"), ("tf2.15", "3.11"), ("tpu", "3.12")):
    pins = {}
    with open(os.path.join(REPO, "requirements", f"{stack}.lock")) as f:
      for line in f:
        if "==" in line and not line.startswith("#"):
          name, version = line.strip().split("==")
          name = name.lower().replace("_", "-")
          pins[provides.get(name, name)] = version
    for text in project["dependencies"]:
      requirement = Requirement(text)
      assert not any(spec.operator == "==" for spec in requirement.specifier), text
      if requirement.marker and not requirement.marker.evaluate({"python_version": python}):
        continue
      name = requirement.name.lower().replace("_", "-")
      assert name in pins, f"{stack}.lock pins no {name}"
      assert requirement.specifier.contains(pins[name], prereleases=True), (
          f"{stack}.lock: {name}=={pins[name]} is outside {text}")
