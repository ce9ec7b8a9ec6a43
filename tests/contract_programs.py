"""Runs a program of examples/legacy_corpus/contract/ on each engine and reads what it wrote.

Each contract program is a small TF 1 TPUEstimator program (only its import
line changed, as the rest of the corpus) that exercises one piece of the
TPUEstimator contract and writes what it observed as JSON to `--results=PATH`
(evaluate()'s dict, predictions, what a hook saw, ...). The tests run it once
with ESTIMATOR_TPU_ENGINE=estimator and once with each other engine (=distribute,
=jax where JAX is installed) and compare.
"""

import json
import os
import sys

from conftest import program_env
import programs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT = os.path.join(REPO, "examples", "legacy_corpus", "contract")


def _has_jax():
  """Whether the JAX engine runs here: JAX installed, and TensorFlow's XLA for the CPU."""
  from estimator_tpu import stacks  # pylint: disable=import-outside-toplevel
  try:
    import jax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return False
  return stacks.HOST_XLA


HAS_JAX = _has_jax()
NO_JAX = ("the JAX engine needs jax (not in this stack's lock) and, on a CPU, TensorFlow's XLA "
          "for the host (not in the tpu stack's TPU build)")
# The engines each program's run is compared with the estimator on: the distribute engine, and
# the JAX engine on the stacks where it runs on the CPU.
OTHERS = ("distribute", *(("jax",) if HAS_JAX else ()))
ENGINES = ("estimator", *OTHERS)
ENGINE_LINES = {
    "distribute": "[estimator_tpu] engine: distribute (OneDeviceStrategy, 1 replica), from "
                  "ESTIMATOR_TPU_ENGINE",
    "jax": "[estimator_tpu] engine: jax (1 cpu device), from ESTIMATOR_TPU_ENGINE"}


def child_env(**env):
  """The environment of a test's own child script (two logical CPUs, a strategy).

  The programs' environment (run() below) but for eager execution, which the child's library
  code runs in as the test process does: the variables that choose a zygote are the same, so the
  child is forked from the zygote the contract programs already started.
  """
  return program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_COMPAT_EXECUTION="eager", **env)


def run(program, engine, work_dir, *args, timeout=300, fresh=False, **env):
  """Runs CONTRACT/program on engine in work_dir/engine; returns (results dict, stdout, stderr).

  Args:
    program: a file name under examples/legacy_corpus/contract/.
    engine: "estimator", "distribute" or "jax" (ESTIMATOR_TPU_ENGINE).
    work_dir: a directory; the run gets --model_dir=work_dir/engine/model and
      --results=work_dir/engine/results.json.
    *args: more flags for the program.
    timeout: seconds.
    fresh: start a new Python (tests/programs.py) where the test reads the start-up's output.
    **env: more environment variables (e.g. ESTIMATOR_TPU_STRATEGY="mirrored").
  """
  run_dir = os.path.join(str(work_dir), engine)
  os.makedirs(run_dir, exist_ok=True)
  results_path = os.path.join(run_dir, "results.json")
  done = programs.run(
      [sys.executable, os.path.join(CONTRACT, program),
       f"--model_dir={os.path.join(run_dir, 'model')}", f"--results={results_path}", *args],
      cwd=REPO, capture_output=True, text=True, timeout=timeout, fresh=fresh,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2", ESTIMATOR_TPU_ENGINE=engine, **env))
  assert done.returncode == 0, (f"{program} on {engine} exited {done.returncode}\n"
                                + done.stdout[-2000:] + done.stderr[-4000:])
  with open(results_path) as f:
    return json.load(f), done.stdout, done.stderr


def run_both(program, work_dir, *args, **kwargs):
  """{engine: results} of program on every engine of ENGINES, same flags."""
  return {engine: run(program, engine, work_dir, *args, **kwargs)[0] for engine in ENGINES}


def run_shared(tmp_path_factory, program):
  """(work dir, run_both's results) of program in a new work dir: a module fixture's one run."""
  work_dir = tmp_path_factory.mktemp(os.path.splitext(program)[0])
  return work_dir, run_both(program, work_dir)
