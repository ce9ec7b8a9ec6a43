"""A real dask.distributed cluster on 127.0.0.1: a scheduler and worker processes.

What `dask scheduler` and `dask worker` run on a cluster's machines, here as
subprocesses of the caller, always stopped when the `with` block ends.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

START_TIMEOUT = 120


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


def _address(scheduler_file, scheduler, log_path):
  deadline = time.monotonic() + START_TIMEOUT
  while not os.path.exists(scheduler_file):
    if scheduler.poll() is not None or time.monotonic() > deadline:
      with open(log_path, encoding="utf-8", errors="replace") as f:
        raise RuntimeError(f"the dask scheduler did not start (status {scheduler.poll()}):\n"
                           f"{f.read()[-2000:]}")
    time.sleep(0.1)
  while True:  # Written, but perhaps not whole yet.
    try:
      with open(scheduler_file, encoding="utf-8") as f:
        return json.load(f)["address"]
    except (ValueError, KeyError):
      time.sleep(0.1)


@contextlib.contextmanager
def local_cluster(num_workers=2, nthreads=1, cwd=None, env=None):
  """Starts a scheduler and num_workers worker processes on 127.0.0.1.

  Workers run without a nanny, each with nthreads threads, in cwd (so that
  they import this checkout's package) with env.

  Yields:
    The scheduler's address, `tcp://127.0.0.1:PORT`, once every worker has joined.

  Raises:
    RuntimeError: the scheduler did not start.
  """
  import distributed

  env = dict(os.environ if env is None else env)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  common = ["--no-dashboard", "--host", "127.0.0.1"]
  procs = []
  with tempfile.TemporaryDirectory(prefix="dask-cluster-") as tmp:
    scheduler_file = os.path.join(tmp, "scheduler.json")
    log_path = os.path.join(tmp, "scheduler.log")
    try:
      with open(log_path, "w", encoding="utf-8") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--port", "0",
             "--scheduler-file", scheduler_file, *common],
            cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT))
      address = _address(scheduler_file, procs[0], log_path)
      for i in range(num_workers):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address,
             "--nthreads", str(nthreads), "--no-nanny", "--name", f"worker-{i}", *common],
            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
      with distributed.Client(address, timeout=START_TIMEOUT) as client:
        client.wait_for_workers(num_workers, timeout=START_TIMEOUT)
      yield address
    finally:
      _stop(procs)
