"""The package a remote runner's workers get: when preprocess.py builds it, and what it holds."""

import os
import subprocess
import sys
import zipfile

from conftest import program_env
import pytest

from estimator_tpu.beam import package
from estimator_tpu.cli import preprocess

DATAFLOW = ["--runner=DataflowRunner", "--project=p", "--region=europe-west4",
            "--temp_location=gs://b/tmp"]


@pytest.mark.parametrize("args,expected", [
    (DATAFLOW, True),
    (["--runner", "FlinkRunner", "--flink_master=localhost:8081"], True),
    (["--runner=PortableRunner", "--job_endpoint=localhost:8099"], True),
    ([], False),
    (["--runner=DirectRunner"], False),
    (["--runner=DaskRunner", "--dask_client_address=tcp://h:8786"], False),
    (["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"], False),
    (DATAFLOW + ["--setup_file=./setup.py"], False),
    (DATAFLOW + ["--extra_package=dist/mine.whl"], False),
    (DATAFLOW + ["--sdk_container_image=gcr.io/p/image:1"], False),
])
def test_only_remote_runners_without_a_package_get_one(args, expected):
  assert package.needs_package(args) is expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  """The wheel preprocess.py passes to a Dataflow job, built as it builds it."""
  dist = str(tmp_path_factory.mktemp("dist"))
  args = preprocess._beam_args(DATAFLOW, dist)
  extra = [a for a in args if a.startswith("--extra_package=")]
  assert len(extra) == 1, args
  return extra[0].split("=", 1)[1]


def test_the_wheel_is_built_from_pyproject_and_leaves_the_checkout_alone(wheel):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  assert os.path.basename(wheel) == "estimator_tpu-0.1.0-py3-none-any.whl"
  assert os.listdir(os.path.dirname(wheel)) == [os.path.basename(wheel)]
  assert not os.path.exists(os.path.join(root, "build"))
  names = zipfile.ZipFile(wheel).namelist()
  for module in ("estimator_tpu/cli/preprocess.py", "estimator_tpu/beam/pipeline.py",
                 "estimator_tpu/beam/encode.py", "estimator_tpu/data/layout.py"):
    assert module in names
  assert {name.split("/")[0] for name in names} == {
      "estimator_tpu", "estimator_tpu-0.1.0.dist-info"}


def _requires(wheel):
  """The wheel's Requires-Dist names (without versions or markers)."""
  archive = zipfile.ZipFile(wheel)
  metadata = archive.read("estimator_tpu-0.1.0.dist-info/METADATA").decode()
  return {line.split(":", 1)[1].strip().split(";")[0].split(">")[0].split("<")[0].split("=")[0]
          .split("[")[0].strip().lower()
          for line in metadata.splitlines() if line.startswith("Requires-Dist:")}


def test_the_workers_wheel_requires_what_the_pipeline_imports_only(wheel):
  assert _requires(wheel) == {"tensorflow", "apache-beam", "absl-py", "pillow", "numpy"}


def test_the_installed_wheel_holds_the_pipelines_dofns(wheel, tmp_path):
  """Installed alone into an empty folder, the wheel gives the workers the DoFns."""
  target = tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                  "--disable-pip-version-check", "--target", str(target), wheel],
                 check=True, capture_output=True)
  code = ("import estimator_tpu.beam.pipeline as p\n"
          "from estimator_tpu.cli import preprocess\n"
          "print(p.__file__); print(preprocess.__file__)\n"
          "fns = (p.EncodeChunkFn('/tmp/t'), p.ConcatShardFn('/tmp/o', {'train': 1}))\n"
          "print(' '.join(type(fn).__name__ for fn in fns))\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True,
                        text=True, env=program_env(PYTHONPATH=str(target)))
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()[-3:]
  assert lines[0] == str(target / "estimator_tpu" / "beam" / "pipeline.py")
  assert lines[1] == str(target / "estimator_tpu" / "cli" / "preprocess.py")
  assert lines[2] == "EncodeChunkFn ConcatShardFn"
