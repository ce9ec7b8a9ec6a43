"""How a remote runner's workers get this package: a wheel built from pyproject.toml.

The wheel holds the estimator_tpu package and requires only what the
pipeline's DoFns import ([tool.estimator_tpu.beam-workers] in pyproject.toml),
not the trainer's and the server's dependencies (TF Serving's API,
TensorBoard, scikit-learn, matplotlib) that `pip install .` brings.

The DirectRunner's workers are this process's threads; Beam's DaskRunner
stages nothing (its workers import from their own environment, see
docs/PREPROCESS.md). Any other runner (Dataflow, Flink, Spark, the portable
runner) gets the wheel as --extra_package, unless the user says how its
workers get the code (--setup_file, --extra_package(s) or a container image).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib

from estimator_tpu.beam import options as preprocess_flags

# Runners whose workers import this package from the environment they run in.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                 "InteractiveRunner", "DaskRunner")
PACKAGE_FLAGS = ("--setup_file", "--extra_package", "--extra_packages",
                 "--sdk_container_image", "--worker_harness_container_image")
# What the wheel is built from (pyproject.toml's one package).
_SOURCES = ("pyproject.toml", "estimator_tpu")


class PackageError(Exception):
  """The package cannot be built; the message says what to pass instead."""


def needs_package(args):
  """Whether Beam args name a remote runner and no way for its workers to get the code."""
  runner = preprocess_flags.runner_name(args)
  if runner is None or runner.rsplit(".", 1)[-1] in LOCAL_RUNNERS:
    return False
  return not any(arg.split("=", 1)[0] in PACKAGE_FLAGS for arg in args)


def project_root():
  """The folder of pyproject.toml this package was installed from (editable or a checkout)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  missing = [name for name in _SOURCES if not os.path.exists(os.path.join(root, name))]
  if missing:
    raise PackageError(
        f"cannot build the package for the workers: {root} has no {missing[0]} (estimator_tpu "
        "is installed, not a checkout); pass --extra_package=estimator_tpu-*.whl, --setup_file "
        "or --sdk_container_image")
  return root


def build_wheel(dest_dir, python=sys.executable):
  """Builds the project's wheel into dest_dir, offline; returns its path.

  The sources are copied first, so the build leaves nothing in the checkout.

  Raises:
    PackageError: there is no pyproject.toml or the build fails.
  """
  root = project_root()
  source = os.path.join(dest_dir, "source")
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  for name in _SOURCES:
    src, dst = os.path.join(root, name), os.path.join(source, name)
    if os.path.isdir(src):
      shutil.copytree(src, dst, ignore=ignore)
    else:
      os.makedirs(source, exist_ok=True)
      shutil.copy2(src, dst)
  with open(os.path.join(source, "pyproject.toml"), "w") as f:
    f.write(workers_pyproject(os.path.join(root, "pyproject.toml")))
  cmd = [python, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--wheel-dir", dest_dir, source]
  done = subprocess.run(cmd, capture_output=True, text=True, check=False)
  wheels = [n for n in os.listdir(dest_dir) if n.endswith(".whl")]
  if done.returncode or len(wheels) != 1:
    raise PackageError(f"building the package for the workers from {root}/pyproject.toml "
                       f"failed ({' '.join(cmd)}):\n{done.stderr.strip()}")
  shutil.rmtree(source)
  return os.path.join(dest_dir, wheels[0])


def workers_pyproject(path):
  """The pyproject.toml the workers' wheel is built from: the project's, with its workers' needs.

  Args:
    path: the project's pyproject.toml.
  """
  with open(path, "rb") as f:
    pyproject = tomllib.load(f)
  project = pyproject["project"]
  setuptools = pyproject["tool"]["setuptools"]
  needs = pyproject["tool"]["estimator_tpu"]["beam-workers"]["dependencies"]
  text = json.dumps  # a JSON string is a TOML basic string
  lines = ["[build-system]", 'requires = ["setuptools>=64"]',
           'build-backend = "setuptools.build_meta"', "", "[project]",
           f"name = {text(project['name'])}", f"version = {text(project['version'])}",
           f"description = {text(project['description'])}",
           f"requires-python = {text(project['requires-python'])}",
           f"dependencies = [{', '.join(text(need) for need in needs)}]", "",
           "[tool.setuptools.packages.find]",
           f"include = [{', '.join(text(i) for i in setuptools['packages']['find']['include'])}]",
           "", "[tool.setuptools.package-data]"]
  for package_name, files in setuptools["package-data"].items():
    lines.append(f"{text(package_name)} = [{', '.join(text(name) for name in files)}]")
  return "\n".join(lines) + "\n"
