"""What --deterministic costs in training speed: the same run with and without it, side by side.

    python benchmarks/bench_deterministic.py [--model=flowers|resnet] [--resnet_depth=18]
        [--image_size=32] [--batch_size=32] [--warmup_steps=20] [--steps=120] [--repeats=5]

Two TPUEstimators (use_tpu=False, one step per session.run as train.py runs
by default) on the digits written by estimator_tpu.testing, identical but
for --deterministic, both with --seed=1: `default`, and `deterministic`
(train.py's path for the flag: its input_fn keeps the input order and keys
its draws, its train() calls run under loop.py's
determinism.deterministic_ops, and its host_call writes no
examples_per_sec). Each of `repeats` rounds makes one train() call of
warm-up + timed steps per side, alternating which goes first, timed as
bench_train.py times them (steady steps/s and images per CPU second). The
last line is one JSON object; `ratio` = deterministic ÷ default steady
steps/s (1 - ratio is what the flag costs).
"""

import argparse
import os
import tempfile

import _args
import _common

from estimator_tpu.run import determinism

SIDES = (("default", False), ("deterministic", True))


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=("flowers", "resnet"), default="flowers")
  parser.add_argument("--resnet_depth", type=int, default=18)
  _args.add_training_timing(parser)
  parser.set_defaults(iterations_per_loop=1)
  return _args.check_training_timing(parser, parser.parse_args())


def make_side(args, work_dir, pattern, name, deterministic):
  config = _common.make_config(os.path.join(work_dir, name), args.image_size, args.batch_size,
                               args.iterations_per_loop, model=args.model,
                               resnet_depth=args.resnet_depth)
  config = config.replace("train", deterministic=deterministic).validate()
  estimator = _common.build_estimator(config)
  input_fn = _common.train_input_fn(config, pattern)

  def run():
    with determinism.deterministic_ops(deterministic):
      figures = _common.time_estimator_train(estimator, input_fn, args.batch_size,
                                             args.warmup_steps, args.steps)
    return dict(figures, steady_steps_per_s=figures["steady_images_per_s"] / args.batch_size)

  run()  # untimed: the first checkpoint, the first graph
  return name, run


def report(name, repeat, figures):
  print(f"  {name:13} run {repeat + 1}: steady {figures['steady_steps_per_s']:6.2f} steps/s "
        f"({figures['images_per_cpu_s']:.1f} images per CPU second, "
        f"{figures['cores_used']:.2f} cores)", flush=True)


def summarize(runs, args, load_start):
  result = {"model": args.model if args.model == "flowers" else f"resnet{args.resnet_depth}",
            "image_size": args.image_size, "batch_size": args.batch_size,
            "warmup_steps": args.warmup_steps, "steps": args.steps, "repeats": args.repeats,
            "cpus": os.cpu_count(), "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for name, side_runs in runs.items():
    for key in ("steady_steps_per_s", "images_per_cpu_s", "cores_used"):
      result[f"{name}_{key}"] = round(_common.median(side_runs, key), 3)
  result["ratio"] = round(result["deterministic_steady_steps_per_s"]
                          / result["default_steady_steps_per_s"], 3)
  result["cpu_ratio"] = round(result["deterministic_images_per_cpu_s"]
                              / result["default_images_per_cpu_s"], 3)
  return result


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  with tempfile.TemporaryDirectory() as work_dir:
    pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
    sides = [make_side(args, work_dir, pattern, name, deterministic)
             for name, deterministic in SIDES]
    print(f"{args.model} network, {args.image_size}x{args.image_size} digits, batch "
          f"{args.batch_size}, --seed=1; {args.warmup_steps} warm-up + {args.steps} timed "
          "steps per call; default vs --deterministic", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize(runs, args, load_start)
  for name in runs:
    print(f"{name:13} median: steady {result[f'{name}_steady_steps_per_s']:.2f} steps/s "
          f"({result[f'{name}_images_per_cpu_s']:.1f} images per CPU second)")
  print(f"--deterministic / default: steady steps/s {result['ratio']:.3f}, "
        f"per CPU second {result['cpu_ratio']:.3f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
