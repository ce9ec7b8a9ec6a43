"""preprocess.py on Beam's DaskRunner and a real dask.distributed cluster, vs the DirectRunner.

The cluster is a scheduler and two single-threaded worker processes on
127.0.0.1, started once for the module and always stopped.
"""

import json
import os
import subprocess
import sys

from conftest import program_env
import distributed
import programs
import pytest
import tensorflow as tf

from estimator_tpu.beam import dask_cluster as dask_cluster_lib
from estimator_tpu.data import layout

# CI runs these end-to-end runs on the default stack only (README, "Tests").
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPROCESS = os.path.join(ROOT, "preprocess.py")
NUM_WORKERS = 2


@pytest.fixture(scope="module")
def dask_cluster():
  """A real scheduler and NUM_WORKERS worker processes; yields the scheduler's tcp:// address."""
  with dask_cluster_lib.local_cluster(NUM_WORKERS, cwd=ROOT) as address:
    yield address


def _start(output_dir, image_folder, *args):
  return programs.start(
      [sys.executable, PREPROCESS, f"--input_dir={image_folder}", f"--output_dir={output_dir}",
       "--num_shards=2", "--validation_fraction=0.25", *args],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=program_env())


def _finish(proc):
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  return out


@pytest.fixture(scope="module")
def runs(dask_cluster, image_folder, tmp_path_factory):
  """The same inputs (27 good and 4 bad files) through the DirectRunner and the Dask cluster."""
  tmp = tmp_path_factory.mktemp("runs")
  direct = _start(str(tmp / "direct"), image_folder)
  dask = _start(str(tmp / "dask"), image_folder, "--runner=DaskRunner",
                f"--dask_client_address={dask_cluster}")
  return {"direct": (str(tmp / "direct"), _finish(direct)),
          "dask": (str(tmp / "dask"), _finish(dask))}


def _read(path, mode="r"):
  with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
    return f.read()


def _without_run_flags(manifest):
  flags = dict(manifest["flags"])
  del flags["output_dir"], flags["pipeline_args"]
  return dict(manifest, flags=flags)


def test_dask_writes_what_the_direct_runner_writes(runs, dask_cluster):
  (direct, direct_out), (dask, dask_out) = runs["direct"], runs["dask"]
  assert sorted(os.listdir(dask)) == sorted(os.listdir(direct))
  manifest = json.loads(_read(os.path.join(dask, layout.MANIFEST_FILE)))
  assert manifest["flags"]["pipeline_args"] == [
      "--runner=DaskRunner", f"--dask_client_address={dask_cluster}"]
  assert _without_run_flags(manifest) == _without_run_flags(
      json.loads(_read(os.path.join(direct, layout.MANIFEST_FILE))))
  assert manifest["rejected"]["count"] == 4 and manifest["images"]["count"] == 27
  for name in (layout.LABELS_FILE, layout.REJECTED_FILE):
    assert _read(os.path.join(dask, name)) == _read(os.path.join(direct, name))
  for split in layout.SPLITS:
    for name in manifest["splits"][split]["shards"]:
      records = {r.numpy() for r in tf.data.TFRecordDataset(os.path.join(dask, name))}
      assert records == {r.numpy() for r in tf.data.TFRecordDataset(
          os.path.join(direct, name))}
  assert dask_out.replace(dask, direct) == direct_out
  assert "  rejected            4  (see rejected.csv)" in dask_out


def test_the_workers_did_the_encoding(runs, dask_cluster):
  del runs  # Ran on the cluster.
  with distributed.Client(dask_cluster, timeout=60) as client:
    # A worker imports TensorFlow only when it runs the pipeline's DoFns.
    ran = client.run(lambda: "estimator_tpu.beam.pipeline" in sys.modules)
  assert len(ran) == NUM_WORKERS and any(ran.values()), ran
