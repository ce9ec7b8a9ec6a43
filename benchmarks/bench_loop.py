"""Host-side cost of the estimator loop: iterations_per_loop 1 / 10 / 100 on CPU.

    python benchmarks/bench_loop.py [--model=tiny] [--image_size=32] [--batch_size=32]
        [--warmup_steps=100] [--steps=200] [--repeats=5]

Three TPUEstimators (use_tpu=False), identical but for iterations_per_loop,
train the same network (default the tiny one, so that per-step host work is
a visible share of a step) on the digits written by estimator_tpu.testing,
fed by the project's training input_fn; summaries every 100 steps. Each of
`repeats` rounds makes one train() call of warmup_steps + steps per side,
rotating which goes first, and times the last `steps` steps as
bench_train.py does (images/s and images per CPU second). Every session.run is
one step on CPU whatever iterations_per_loop says: TPUEstimator runs
iterations_per_loop steps per session.run (an on-device loop fed by infeed)
only on a TPU. The last line is one JSON object; `ratio` is
iterations_per_loop=100 ÷ iterations_per_loop=1 steady images/s.
"""

import argparse
import os
import tempfile

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common

LOOPS = (1, 10, 100)


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=("tiny", "flowers"), default="tiny")
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--warmup_steps", type=int, default=100)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  for name in ("warmup_steps", "steps"):
    value = getattr(args, name)
    if value <= 0 or value % max(LOOPS):
      parser.error(f"--{name}={value} must be a positive multiple of {max(LOOPS)}")
  return args


def make_sides(args, work_dir):
  pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
  sides = []
  for loop in LOOPS:
    config = _common.make_config(os.path.join(work_dir, f"loop{loop}"), args.image_size,
                                 args.batch_size, loop, model=args.model)
    config = config.replace("train", summary_every_n_steps=100).validate()
    estimator = _common.build_estimator(config)
    input_fn = _common.train_input_fn(config, pattern)
    estimator.train(input_fn, steps=max(LOOPS))  # untimed: the first checkpoint

    def run(estimator=estimator, input_fn=input_fn):
      return _common.time_estimator_train(estimator, input_fn, args.batch_size,
                                          args.warmup_steps, args.steps)
    sides.append((f"loop{loop}", run))
  return sides


def report(name, repeat, figures):
  print(f"  {name:8} run {repeat + 1}: steady {figures['steady_images_per_s']:7.1f} images/s "
        f"on {figures['cores_used']:.2f} cores, wall {figures['wall_images_per_s']:7.1f} "
        f"images/s", flush=True)


def summarize(runs, args, load_start):
  result = {"model": args.model, "image_size": args.image_size,
            "batch_size": args.batch_size, "warmup_steps": args.warmup_steps,
            "steps": args.steps, "repeats": args.repeats, "cpus": os.cpu_count(),
            "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for side, side_runs in runs.items():
    for key in ("steady_images_per_s", "images_per_cpu_s", "cores_used", "wall_images_per_s"):
      result[f"{side}_{key}"] = round(_common.median(side_runs, key), 2)
  for loop in LOOPS[1:]:
    result[f"loop{loop}_over_loop1"] = round(
        result[f"loop{loop}_steady_images_per_s"] / result["loop1_steady_images_per_s"], 3)
  result["ratio"] = result[f"loop{max(LOOPS)}_over_loop1"]
  return result


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  with tempfile.TemporaryDirectory() as work_dir:
    sides = make_sides(args, work_dir)
    print(f"{args.model} network, {args.image_size}x{args.image_size} digits, batch "
          f"{args.batch_size}; {args.warmup_steps} warm-up + {args.steps} timed steps "
          f"per call; iterations_per_loop {', '.join(map(str, LOOPS))}", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize(runs, args, load_start)
  for side in runs:
    print(f"{side:8} median: steady {result[f'{side}_steady_images_per_s']:.1f} images/s "
          f"({result[f'{side}_images_per_cpu_s']:.1f} per CPU second), wall "
          f"{result[f'{side}_wall_images_per_s']:.1f} images/s")
  print("iterations_per_loop 10/1 " f"{result['loop10_over_loop1']:.3f}, 100/1 "
        f"{result['ratio']:.3f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
