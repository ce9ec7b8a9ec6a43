"""What the distribute engine's graph twin costs a train() call, and that its steps cost the same.

    python benchmarks/bench_graph_twin.py [--batch_size=32] [--steps=120] [--repeats=5]

Two DistributeEngines on the flowers CNN and the digits, identical but for
RunConfig(checkpoint_save_graph_def): True (the default: the model_fn's TF 1
graph twin is built once per train() call, a fresh run starts from its
session's values, each checkpoint gets its `.meta`, model_dir a graph.pbtxt)
and False (no twin: nothing of it is built). Each side runs, alternating which
goes first, a train() from nothing (fresh model_dir) of warm-up + timed steps,
timed whole, and its steady images/s over the timed steps. The last line is one
JSON object; `ratio` = the fresh train() call's wall seconds with the twin ÷ without,
`steady_ratio` = steady images/s with ÷ without (1 if nothing runs per step).
"""

import argparse
import os
import shutil
import tempfile

import _args
import _common
import tensorflow as tf

from estimator_tpu.engines import tpu_estimator
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.model import model_fn as model_fn_lib

SIDES = ((True, "twin"), (False, "no_twin"))


def _engine(config, model_dir, save_graph_def, iterations_per_loop):
  params = tpu_estimator.build_params(config, config.data.class_names)
  run_config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir, checkpoint_save_graph_def=save_graph_def)
  return distribute_engine.DistributeEngine(
      model_fn_lib.model_fn, params, tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir,
      config.train.train_batch_size, config.train.eval_batch_size,
      iterations_per_loop=iterations_per_loop,
      save_checkpoints_steps=_common.NO_PERIODIC_CHECKPOINTS, run_config=run_config)


def _fresh_train(config, work_dir, save_graph_def, input_fn, args):
  """time_estimator_train's figures of one train() from nothing (a fresh model_dir)."""
  model_dir = os.path.join(work_dir, "twin" if save_graph_def else "no_twin")
  shutil.rmtree(model_dir, ignore_errors=True)
  engine = _engine(config, model_dir, save_graph_def, args.iterations_per_loop)
  return _common.time_estimator_train(engine, input_fn, args.batch_size, args.warmup_steps,
                                      args.steps)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  _args.add_training_timing(parser)
  args = _args.check_training_timing(parser, parser.parse_args())
  _common.quiet_tf()
  with tempfile.TemporaryDirectory() as work_dir:
    pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
    config = _common.make_config(os.path.join(work_dir, "config"), args.image_size,
                                 args.batch_size, args.iterations_per_loop)
    input_fn = _common.train_input_fn(config, pattern)
    _fresh_train(config, work_dir, False, input_fn, args)  # untimed: TensorFlow's first use
    sides = [(name, lambda on=on: _fresh_train(config, work_dir, on, input_fn, args))
             for on, name in SIDES]
    runs = _common.alternate(sides, args.repeats, lambda name, r, f: print(
        f"  {name:8} run {r + 1}: train() {f['wall_seconds']:6.2f} s (setup "
        f"{f['setup_seconds']:5.2f} s, teardown {f['teardown_seconds']:5.2f} s), steady "
        f"{f['steady_images_per_s']:7.1f} images/s", flush=True))
  result = {"batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats}
  for name, side_runs in runs.items():
    for key in ("wall_seconds", "setup_seconds", "teardown_seconds", "steady_images_per_s"):
      result[f"{name}_{key}"] = round(_common.median(side_runs, key), 3)
  result["ratio"] = round(result["twin_wall_seconds"] / result["no_twin_wall_seconds"], 3)
  result["steady_ratio"] = round(result["twin_steady_images_per_s"]
                                 / result["no_twin_steady_images_per_s"], 3)
  print(f"fresh train() with the twin / without: {result['ratio']:.3f} "
        f"(+{result['twin_wall_seconds'] - result['no_twin_wall_seconds']:.2f} s); steady images/s "
        f"{result['steady_ratio']:.3f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
