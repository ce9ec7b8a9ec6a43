"""Accuracy of the digits trained by train.py in bfloat16 vs float32, and what the export serves.

    python benchmarks/bench_precision.py [--steps=200] [--batch_size=32] [--image_size=32]
        [--num_eval=170] [--repeats=5] [--precisions=float32,bfloat16] [--engine=estimator]

Writes scikit-learn's digits (1797 images; the last --num_eval held out for
evaluation) as JPEG records in preprocess.py's layout, then each repeat runs
`train.py --precision=P --seed=R --mode=train_and_eval --export_dir=...` once per
precision on the flowers CNN (the demo's network and flags: --image_size=32
--norandom_flip), alternating which precision goes first. Per run:
  accuracy: the exact evaluation train.py records at the last step
    (eval_history.jsonl);
  agreement: the share of the evaluation images whose class the float32
    SavedModel (serving.predict.Predictor, JPEG bytes in) gives the same as
    `predict()` on the checkpoint in the run's precision;
  seconds: the train.py run, export included.
The last line is one JSON object: medians over repeats of every precision's
accuracy, the per-repeat `<precision>_minus_float32` accuracy differences
(median, and the largest shortfall), the lowest agreement of any run, and
`ratio` = bfloat16 ÷ float32 accuracy (medians). Targets (issue 36): bfloat16
within 0.01 of float32, agreement >= 0.99. On a CPU without bfloat16 units a
bfloat16 run takes ~4 minutes (emulated), a float32 run ~35 s.
"""

import argparse
import os
import statistics
import tempfile
import time

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
from absl import flags
import numpy as np
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import testing
from estimator_tpu.cli import train
from estimator_tpu.data import input_pipeline
from estimator_tpu.export import saved_model
from estimator_tpu.model import precision as precision_lib
from estimator_tpu.run import assemble
from estimator_tpu.run import curves
from estimator_tpu.serving import predict as serving_predict


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--num_eval", type=int, default=170)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--precisions", default="float32,bfloat16")
  parser.add_argument("--engine", choices=("estimator", "distribute"), default="estimator")
  args = parser.parse_args()
  args.precisions = args.precisions.split(",")
  unknown = sorted(set(args.precisions) - set(precision_lib.PRECISIONS))
  if unknown:
    parser.error(f"--precisions: {', '.join(unknown)} not one of "
                 f"{', '.join(precision_lib.PRECISIONS)}")
  if "float32" not in args.precisions or len(set(args.precisions)) < 2:
    parser.error("--precisions must name float32, the side the others are compared with, and "
                 "at least one other")
  if not 0 < args.num_eval < _common.MAX_DIGITS:
    parser.error(f"--num_eval={args.num_eval} must be between 1 and {_common.MAX_DIGITS - 1}")
  return args


def train_flags(args, data_dir, work_dir, precision, seed):
  """train.py's flags for one run."""
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  run_dir = os.path.join(work_dir, f"{precision}_{seed}")
  flag_values([
      "train.py", f"--data_dir={data_dir}", f"--model_dir={run_dir}/model",
      f"--export_dir={run_dir}/export", f"--image_size={args.image_size}", "--norandom_flip",
      f"--train_steps={args.steps}", f"--steps_per_eval={args.steps}",
      f"--train_batch_size={args.batch_size}", f"--eval_batch_size={args.batch_size}",
      f"--precision={precision}", f"--seed={seed}", f"--engine={args.engine}",
      "--mode=train_and_eval"])
  return flag_values, run_dir


def eval_images(data_dir):
  """The encoded validation images, in file order."""
  files = sorted(tf.io.gfile.glob(os.path.join(data_dir, "validation-*")))
  return [item.image_bytes for item in serving_predict.tfrecord_items(files)]


def last_accuracy(model_dir):
  return curves.read_history(model_dir)[-1]["accuracy"]


def agreement(run_dir, images):
  """Share of images whose served class is predict()'s on the checkpoint."""
  config = config_lib.read_config(os.path.join(run_dir, "model"))
  input_fn = input_pipeline.make_predict_input_fn(images, config.data.image_size,
                                                  config.data.eval_crop,
                                                  config.data.eval_crop_form)
  expected = [int(p["classid"]) for p in assemble.build(config).predict(input_fn)]
  served = serving_predict.Predictor(
      saved_model.latest_export(os.path.join(run_dir, "export"))).predict(images)
  if len(served) != len(expected):
    raise RuntimeError(f"{run_dir}: the export served {len(served)} of {len(images)} images, "
                       f"predict() gave {len(expected)}")
  return float(np.mean([r.classid == e for r, e in zip(served, expected)]))


def one_run(args, data_dir, work_dir, images, precision, seed):
  flag_values, run_dir = train_flags(args, data_dir, work_dir, precision, seed)
  start = time.perf_counter()
  status = train.run(flag_values)
  seconds = time.perf_counter() - start
  if status:
    raise SystemExit(f"train.py --precision={precision} --seed={seed} exited {status}")
  return {"accuracy": last_accuracy(os.path.join(run_dir, "model")),
          "agreement": agreement(run_dir, images), "seconds": seconds}


def summarize(args, runs):
  result = {"steps": args.steps, "batch_size": args.batch_size, "image_size": args.image_size,
            "num_eval": args.num_eval, "repeats": args.repeats, "engine": args.engine,
            "cpu_bfloat16_units": precision_lib.cpu_computes_bfloat16()}
  for precision, figures in runs.items():
    for key in ("accuracy", "agreement", "seconds"):
      result[f"{precision}_{key}"] = round(statistics.median(f[key] for f in figures), 4)
    result[f"{precision}_lowest_agreement"] = min(f["agreement"] for f in figures)
    if precision != "float32":
      differences = [f["accuracy"] - base["accuracy"]
                     for f, base in zip(figures, runs["float32"])]
      result[f"{precision}_minus_float32"] = round(statistics.median(differences), 4)
      result[f"{precision}_largest_shortfall"] = round(max(0.0, -min(differences)), 4)
  other = "bfloat16" if "bfloat16" in runs else next(p for p in runs if p != "float32")
  result["ratio"] = round(result[f"{other}_accuracy"] / result["float32_accuracy"], 4)
  return result


def main():
  args = parse_args()
  _common.quiet_tf()
  with tempfile.TemporaryDirectory() as work_dir:
    data_dir = testing.write_digits_dataset(
        os.path.join(work_dir, "data"), num_train=_common.MAX_DIGITS - args.num_eval,
        num_eval=args.num_eval, size=args.image_size, train_shards=4)
    images = eval_images(data_dir)
    print(f"flowers CNN on {_common.MAX_DIGITS - args.num_eval} digits at {args.image_size} px, "
          f"{args.steps} steps of {args.batch_size}, {len(images)} evaluation images, "
          f"{args.engine} engine, {args.repeats} seeds", flush=True)
    seeds = dict.fromkeys(args.precisions, 0)

    def side(precision):
      def run():  # every precision trains with seeds 1, 2, ... in turn
        seeds[precision] += 1
        return one_run(args, data_dir, work_dir, images, precision, seeds[precision])
      return precision, run

    sides = [side(precision) for precision in args.precisions]
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize(args, runs)
  for precision in args.precisions:
    print(f"{precision:9} median: accuracy {result[f'{precision}_accuracy']:.4f}, agreement "
          f"{result[f'{precision}_agreement']:.4f} (lowest "
          f"{result[f'{precision}_lowest_agreement']:.4f}), "
          f"{result[f'{precision}_seconds']:.0f}s per run")
  _common.print_json(result)


def report(name, repeat, figures):
  print(f"  {name:9} seed {repeat + 1}: accuracy {figures['accuracy']:.4f}, agreement "
        f"{figures['agreement']:.4f}, {figures['seconds']:.0f}s", flush=True)


if __name__ == "__main__":
  main()
