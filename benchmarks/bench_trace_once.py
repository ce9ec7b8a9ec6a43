"""What tracing the model_fn once, not twice, saves a fresh train() on the distribute/JAX engines.

    python benchmarks/bench_trace_once.py [--model=flowers|resnet] [--engines=distribute,jax]
        [--image_size=32] [--batch_size=8] [--steps=3] [--repeats=5]

The engines make the model_fn's variables the first time their step
function is traced, outside the trace (the strategy's distributed
variables, by the estimator's names: engines/distribute/variables.py). Made
as tf.function makes variables created in its first trace ("lifted"),
tf.function then traced the whole model_fn again, a trace per run that built
nothing new; made unlifted, the first trace is the step's. The two sides:
  once: the engine as it is (variables not lifted);
  twice: the same engine with its variables made lifted, as before.
Each repeat runs a train() of --steps steps from nothing (a fresh model_dir)
on each side, an engine's two sides one after the other, alternating which
goes first; the figures are medians of the repeats: the call's wall seconds
and the process's CPU seconds during it. Each round's two sides, run close
together, give a ratio once ÷ twice that the host's drift over minutes moves
little.

The last line is one JSON object: {engine}_{side}_cpu_seconds and
_wall_seconds (medians), {engine}_ratio (the median of the rounds' CPU
seconds once ÷ twice) and `ratio`, the same over the engines' CPU summed.
"""

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from unittest import mock

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import tensorflow as tf

from estimator_tpu.engines.distribute import variables as variables_lib

SIDES = ("once", "twice")


class _LiftedTF:
  """The tensorflow module, but tf.Variable makes variables lifted (tf.function's default)."""

  def __getattr__(self, name):
    return getattr(tf, name)

  @staticmethod
  def Variable(**kwargs):  # noqa: N802 (tf.Variable's name)
    kwargs.pop("experimental_enable_variable_lifting", None)
    return tf.Variable(**kwargs)


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=("flowers", "resnet"), default="flowers")
  parser.add_argument("--resnet_depth", type=int, default=18)
  parser.add_argument("--engines", default="distribute,jax")
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  args.engines = [e for e in args.engines.split(",") if e]
  unknown = sorted(set(args.engines) - {"distribute", "jax"})
  if unknown or not args.engines:
    parser.error(f"--engines={','.join(args.engines)}: name distribute and/or jax")
  if args.steps < 1 or args.repeats < 1:
    parser.error("--steps and --repeats must be at least 1")
  return args


def fresh_train(args, work_dir, pattern, engine, side):
  """{wall_seconds, cpu_seconds} of one train() of args.steps steps from a fresh model_dir."""
  model_dir = os.path.join(work_dir, f"{engine}-{side}")
  shutil.rmtree(model_dir, ignore_errors=True)
  config = _common.make_config(model_dir, args.image_size, args.batch_size, 1,
                               model=args.model, resnet_depth=args.resnet_depth).replace(
      "runtime", engine=engine, strategy="one_device").validate()
  estimator = _common.build_estimator(config)
  input_fn = _common.train_input_fn(config, pattern)
  with (mock.patch.object(variables_lib, "tf", _LiftedTF()) if side == "twice"
        else contextlib.nullcontext()):
    wall, cpu = time.perf_counter(), time.process_time()
    estimator.train(input_fn, max_steps=args.steps)
    return {"wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}


def main():
  args = parse_args()
  _common.quiet_tf()
  with tempfile.TemporaryDirectory() as work_dir:
    pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
    for engine in args.engines:  # untimed: TensorFlow's and JAX's first use
      fresh_train(args, work_dir, pattern, engine, "once")
    runs = {}
    for engine in args.engines:  # an engine's two sides side by side, alternating
      sides = [(f"{engine}_{side}",
                lambda engine=engine, side=side: fresh_train(args, work_dir, pattern, engine,
                                                             side))
               for side in SIDES]
      runs.update(_common.alternate(sides, args.repeats, lambda name, r, f: print(
          f"  {name:16} run {r + 1}: {f['cpu_seconds']:6.2f} CPU s, {f['wall_seconds']:6.2f} s",
          flush=True)))
  result = {"model": args.model, "steps": args.steps, "repeats": args.repeats,
            "image_size": args.image_size, "batch_size": args.batch_size}
  for name, side_runs in runs.items():
    for key in ("cpu_seconds", "wall_seconds"):
      result[f"{name}_{key}"] = round(_common.median(side_runs, key), 3)
  # The host's speed drifts over minutes: each round's two sides, run close together, are
  # compared with each other, and the ratio is the median of the rounds' ratios.
  for engine in args.engines:
    ratios = [once["cpu_seconds"] / twice["cpu_seconds"]
              for once, twice in zip(runs[f"{engine}_once"], runs[f"{engine}_twice"])]
    result[f"{engine}_ratio"] = round(statistics.median(ratios), 3)
    print(f"{engine}: {result[f'{engine}_once_cpu_seconds']:.2f} CPU s traced once, "
          f"{result[f'{engine}_twice_cpu_seconds']:.2f} twice (median of the rounds' ratios "
          f"{result[f'{engine}_ratio']:.3f})")
  result["ratio"] = round(statistics.median(
      sum(runs[f"{engine}_once"][r]["cpu_seconds"] for engine in args.engines)
      / sum(runs[f"{engine}_twice"][r]["cpu_seconds"] for engine in args.engines)
      for r in range(args.repeats)), 3)
  _common.print_json(result)


if __name__ == "__main__":
  main()
