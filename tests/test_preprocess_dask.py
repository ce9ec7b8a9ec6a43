"""preprocess.py on Beam's DaskRunner and a real dask.distributed cluster, vs the DirectRunner.

The cluster is a scheduler and two single-threaded worker processes on
127.0.0.1, started once for the module and always stopped.
"""

import json
import os
import subprocess
import sys
import time

from conftest import program_env
import distributed
import pytest
import tensorflow as tf

from estimator_tpu.data import layout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREPROCESS = os.path.join(ROOT, "preprocess.py")
NUM_WORKERS = 2
_START_TIMEOUT = 120


def _stop(procs, timeout=10):
  """Stops the workers, then the scheduler (workers left without one wait to reconnect)."""
  for group in (procs[1:], procs[:1]):
    for proc in group:
      if proc.poll() is None:
        proc.terminate()
    for proc in group:
      try:
        proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _scheduler_address(scheduler_file, scheduler):
  deadline = time.monotonic() + _START_TIMEOUT
  while not os.path.exists(scheduler_file):
    if scheduler.poll() is not None or time.monotonic() > deadline:
      raise RuntimeError(f"dask scheduler did not start (status {scheduler.poll()}): "
                         f"{scheduler.stderr.read() if scheduler.poll() is not None else ''}")
    time.sleep(0.1)
  time.sleep(0.2)  # The file is written whole, but let it be closed.
  with open(scheduler_file, encoding="utf-8") as f:
    return json.load(f)["address"]


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
  """A real scheduler and NUM_WORKERS worker processes; yields the scheduler's tcp:// address."""
  tmp = tmp_path_factory.mktemp("dask")
  scheduler_file = str(tmp / "scheduler.json")
  common = ["--no-dashboard", "--host", "127.0.0.1"]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", DASK_DISTRIBUTED__WORKER__DAEMON="False")
  procs = []
  try:
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
         "--scheduler-file", scheduler_file, *common],
        cwd=str(tmp), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    address = _scheduler_address(scheduler_file, procs[0])
    procs[0].stderr.close()  # Not read again: it must not fill up.
    for i in range(NUM_WORKERS):
      procs.append(subprocess.Popen(
          [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
           "--no-nanny", "--name", f"worker-{i}", *common],
          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    with distributed.Client(address, timeout=_START_TIMEOUT) as client:
      client.wait_for_workers(NUM_WORKERS, timeout=_START_TIMEOUT)
    yield address
  finally:
    _stop(procs)


def _start(output_dir, image_folder, *args):
  return subprocess.Popen(
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
