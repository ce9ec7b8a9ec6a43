"""What the train/* summaries cost: host_call every step against every 100 steps, same run.

    python benchmarks/bench_summaries.py [--batch_size=32] [--steps=200] [--repeats=5]

Two TPUEstimators (use_tpu=False) on the flowers CNN and the digits, identical
but for --summary_every_n_steps (1 and 100), each timed over train() calls of
warm-up + timed steps as bench_train.py times them, alternating which goes
first. Off TPU the host_call runs every step either way and only the writes
differ; on a TPU every_n also spares the outfeed. The last line is one JSON
object; `ratio` = steady images/s with summaries every step ÷ every 100 steps
(1 - ratio is the summaries' share of step time).
"""

import argparse
import os
import tempfile

import _args
import _common

EVERY = (1, 100)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  _args.add_training_timing(parser)
  parser.set_defaults(steps=200)
  args = _args.check_training_timing(parser, parser.parse_args())
  _common.quiet_tf()
  with tempfile.TemporaryDirectory() as work_dir:
    pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
    sides = []
    for every in EVERY:
      config = _common.make_config(os.path.join(work_dir, f"every{every}"), args.image_size,
                                   args.batch_size, args.iterations_per_loop)
      config = config.replace("train", summary_every_n_steps=every).validate()
      estimator = _common.build_estimator(config)
      input_fn = _common.train_input_fn(config, pattern)

      def run(estimator=estimator, input_fn=input_fn):
        return _common.time_estimator_train(estimator, input_fn, args.batch_size,
                                            args.warmup_steps, args.steps)

      run()  # untimed: the first checkpoint, the first graph
      sides.append((f"every_{every}", run))
    runs = _common.alternate(sides, args.repeats, lambda name, r, f: print(
        f"  {name:9} run {r + 1}: steady {f['steady_images_per_s']:7.1f} images/s "
        f"({f['images_per_cpu_s']:.1f} per CPU second)", flush=True))
  result = {"batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats}
  for name, side_runs in runs.items():
    for key in ("steady_images_per_s", "images_per_cpu_s"):
      result[f"{name}_{key}"] = round(_common.median(side_runs, key), 2)
  result["ratio"] = round(result["every_1_steady_images_per_s"]
                          / result["every_100_steady_images_per_s"], 3)
  result["cpu_ratio"] = round(result["every_1_images_per_cpu_s"]
                              / result["every_100_images_per_cpu_s"], 3)
  print(f"summaries every step / every 100 steps: steady {result['ratio']:.3f}, "
        f"per CPU second {result['cpu_ratio']:.3f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
