"""Training images/s of the current stack against tf2.15's, alternating in one run.

    python benchmarks/bench_stacks.py [--batch_size=32] [--warmup_steps=20] [--steps=120]
        [--repeats=5]

Starts one worker per stack (.venv/bin/python and .venv-tf2.15/bin/python, as
`make install` and `make install STACK=tf2.15` build them). Each worker writes
the digits, builds the project's TPUEstimator (use_tpu=False) for the flowers
CNN once and makes one untimed train() call; then, round after round, the
parent asks each worker in turn (alternating which goes first) for one timed
train() call of warmup_steps + steps, timed as bench_train.py times its
estimator side. The last line is one JSON object; `ratio` is current ÷ tf2.15
median steady-state images/s, `cpu_ratio` the same per CPU second.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import _args

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACKS = (("current", ".venv"), ("tf2.15", ".venv-tf2.15"))
KEYS = ("steady_images_per_s", "images_per_cpu_s", "cores_used", "wall_images_per_s")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  _args.add_training_timing(parser)
  parser.add_argument("--worker", metavar="WORK_DIR", help=argparse.SUPPRESS)
  return _args.check_training_timing(parser, parser.parse_args(argv))


def worker(args):
  """Builds the estimator side, then answers each 'run' line on stdin with one JSON line."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import _common

  from estimator_tpu import stacks
  _common.quiet_tf()
  pattern = _common.write_digits(os.path.join(args.worker, "data"), args.image_size)
  config = _common.make_config(os.path.join(args.worker, "model"), args.image_size,
                               args.batch_size, args.iterations_per_loop)
  estimator = _common.build_estimator(config)
  input_fn = _common.train_input_fn(config, pattern)
  _common.time_estimator_train(estimator, input_fn, args.batch_size,
                               args.iterations_per_loop, args.iterations_per_loop)
  print(json.dumps({"ready": stacks.describe()}), flush=True)
  for line in sys.stdin:
    if line.strip() != "run":
      break
    figures = _common.time_estimator_train(estimator, input_fn, args.batch_size,
                                           args.warmup_steps, args.steps)
    print(json.dumps(figures), flush=True)


def start_workers(args, work_dir):
  """One worker process per stack; exits with a message if a venv is missing."""
  flags = [f"--{k}={getattr(args, k)}" for k in
           ("image_size", "batch_size", "iterations_per_loop", "warmup_steps", "steps")]
  workers = {}
  for name, venv in STACKS:
    python = os.path.join(ROOT, venv, "bin", "python")
    if not os.path.exists(python):
      sys.exit(f"bench_stacks.py: {python} is missing: run make install"
               f"{'' if name == 'current' else ' STACK=' + name} first")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    workers[name] = subprocess.Popen(
        [python, os.path.abspath(__file__), f"--worker={os.path.join(work_dir, name)}", *flags],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
  for name, process in workers.items():
    ready = json.loads(process.stdout.readline())
    print(f"{name:8} {ready['ready']}", flush=True)
  return workers


def median(values):
  values = sorted(values)
  middle = len(values) // 2
  return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main():
  args = parse_args()
  if args.worker:
    worker(args)
    return
  names = [name for name, _ in STACKS]
  runs = {name: [] for name in names}
  with tempfile.TemporaryDirectory() as work_dir:
    workers = start_workers(args, work_dir)
    for repeat in range(args.repeats):
      order = names[repeat % 2:] + names[:repeat % 2]
      for name in order:
        workers[name].stdin.write("run\n")
        workers[name].stdin.flush()
        figures = json.loads(workers[name].stdout.readline())
        runs[name].append(figures)
        print(f"  {name:8} run {repeat + 1}: steady {figures['steady_images_per_s']:7.1f} "
              f"images/s ({figures['images_per_cpu_s']:.1f} per CPU second)", flush=True)
    for process in workers.values():
      process.stdin.close()
      process.wait(timeout=120)
  result = {"batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats}
  for name in names:
    for key in KEYS:
      result[f"{name}_{key}"] = round(median([r[key] for r in runs[name]]), 2)
  result["ratio"] = round(result["current_steady_images_per_s"]
                          / result["tf2.15_steady_images_per_s"], 3)
  result["cpu_ratio"] = round(result["current_images_per_cpu_s"]
                              / result["tf2.15_images_per_cpu_s"], 3)
  print(f"current/tf2.15: steady {result['ratio']:.3f} (target >= 0.95), "
        f"per CPU second {result['cpu_ratio']:.3f}")
  print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
  main()
