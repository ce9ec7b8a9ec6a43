"""Input images/s: the training input_fn vs the same work single-threaded vs training itself.

    python benchmarks/bench_input.py [--jpeg_size=128] [--image_size=32]
        [--batch_size=32] [--batches=200] [--train_steps=60] [--repeats=5]
        [--synthetic]

Writes the digits as jpeg_size JPEGs with estimator_tpu.testing and measures,
alternating the sides within each of `repeats` rounds:
  input: the training dataset of input_pipeline.make_input_fn alone (parallel
    interleave and maps, AUTOTUNE, prefetch), `batches` batches after warm-up;
  single_threaded: the same decode + preprocess (schema.parse_example,
    image_ops.decode_image and augment_for_train, same shuffle buffer and
    batch) as a tf.data pipeline with no parallel calls, deterministic, one
    private thread, intra-op parallelism 1, no autotuning or injected prefetch;
  train: steady-state images/s of TPUEstimator(use_tpu=False).train of the
    flowers CNN on the same files (a SessionRunHook times the steps after the
    warm-up ones);
  train_synthetic (with --synthetic): the same training fed one cached batch
    repeated, so any gap to `train` is time the step waited for input while
    sharing the cores with it.
Every side also reports the CPU cores it used and images per CPU second (the
machine may be shared). The last line is one JSON object; `ratio` is input ÷
train images/s (the input is not the bottleneck when it is >= 3) and
`input_over_single_threaded` input ÷ single-threaded images/s.
"""

import argparse
import os
import tempfile

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import tensorflow as tf

from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema

WARMUP_BATCHES = 20
TRAIN_WARMUP_STEPS = 20


def single_threaded_dataset(file_pattern, config):
  """The training input_fn's work, one record at a time on one thread."""
  image_size, seed = config.data.image_size, config.train.seed
  random_flip = config.data.random_flip

  def decode(serialized):
    parsed = schema.parse_example(serialized)
    return image_ops.decode_image(parsed["image_bytes"]), parsed["label"]

  def augment(image, label):
    return ({schema.IMAGE_KEY: image_ops.augment_for_train(
        image, image_size, random_flip=random_flip, seed=seed)}, label)

  files = tf.data.Dataset.list_files(file_pattern, shuffle=True, seed=seed)
  dataset = files.flat_map(lambda f: tf.data.TFRecordDataset(
      f, buffer_size=input_pipeline.READ_BUFFER_BYTES))
  dataset = dataset.map(decode)
  dataset = dataset.shuffle(input_pipeline.SHUFFLE_BUFFER, seed=seed).repeat()
  dataset = dataset.map(augment)
  dataset = dataset.batch(config.train.train_batch_size, drop_remainder=True)
  return dataset.with_options(_single_thread_options())


def _single_thread_options():
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  options.autotune.enabled = False
  options.experimental_optimization.map_parallelization = False
  options.experimental_optimization.inject_prefetch = False
  return options


def time_batches(dataset, batches, batch_size):
  """Images/s of `batches` batches from a fresh iterator, after warm-up ones."""
  iterator = iter(dataset)
  for _ in range(WARMUP_BATCHES):  # shuffle buffer fill, autotuning
    next(iterator)
  start = _common.clocks()
  for _ in range(batches):
    next(iterator)
  return _common.window_figures(start, _common.clocks(), batches * batch_size)


def synthetic_input_fn(input_fn):
  """input_fn's first batch, cached and repeated: training with free input."""

  def synthetic(params):
    return input_fn(params).take(1).cache().repeat()

  return synthetic


def time_train(estimator, input_fn, batch_size, steps):
  figures = _common.time_estimator_train(
      estimator, input_fn, batch_size, TRAIN_WARMUP_STEPS, steps)
  return {"images_per_s": figures["steady_images_per_s"],
          "cores_used": figures["cores_used"],
          "images_per_cpu_s": figures["images_per_cpu_s"],
          "wall_images_per_s": figures["wall_images_per_s"]}


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--jpeg_size", type=int, default=128)
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--batches", type=int, default=200,
                      help="timed batches per input measurement")
  parser.add_argument("--train_steps", type=int, default=60,
                      help="timed steps per training measurement")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--synthetic", action="store_true",
                      help="also time training on one cached batch")
  args = parser.parse_args()
  if args.batches <= 0 or args.train_steps <= 0:
    parser.error("--batches and --train_steps must be positive")
  return args


def report(name, repeat, figures):
  print(f"  {name:16} run {repeat + 1}: {figures['images_per_s']:8.1f} images/s "
        f"on {figures['cores_used']:.2f} cores", flush=True)


def make_sides(args, work_dir):
  """The (name, fn) pairs to alternate."""
  pattern = _common.write_digits(os.path.join(work_dir, "data"), args.jpeg_size)
  config = _common.make_config(os.path.join(work_dir, "model"), args.image_size,
                               args.batch_size, iterations_per_loop=10)
  input_fn = _common.train_input_fn(config, pattern)
  dataset = input_fn({"batch_size": args.batch_size})
  single = single_threaded_dataset(pattern, config)
  estimator = _common.build_estimator(config)
  estimator.train(input_fn, steps=10)  # untimed: the first checkpoint
  b = args.batch_size
  sides = [
      ("input", lambda: time_batches(dataset, args.batches, b)),
      ("single_threaded", lambda: time_batches(single, args.batches, b)),
      ("train", lambda: time_train(estimator, input_fn, b, args.train_steps)),
  ]
  if args.synthetic:
    synthetic = synthetic_input_fn(input_fn)
    sides.append(("train_synthetic",
                  lambda: time_train(estimator, synthetic, b, args.train_steps)))
  return sides


def summarize(runs, args, load_start):
  result = {"jpeg_size": args.jpeg_size, "image_size": args.image_size,
            "batch_size": args.batch_size, "batches": args.batches,
            "train_steps": args.train_steps, "repeats": args.repeats,
            "cpus": os.cpu_count(), "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average(),
            "single_threaded_kind": "tf.data, num_parallel_calls=None, "
                                    "deterministic, private_threadpool_size=1"}
  for side, side_runs in runs.items():
    result[f"{side}_images_per_s"] = round(_common.median(side_runs, "images_per_s"), 1)
    result[f"{side}_cores_used"] = round(_common.median(side_runs, "cores_used"), 2)
    result[f"{side}_images_per_cpu_s"] = round(
        _common.median(side_runs, "images_per_cpu_s"), 1)
  result["train_wall_images_per_s"] = round(
      _common.median(runs["train"], "wall_images_per_s"), 1)
  result["ratio"] = round(result["input_images_per_s"]
                          / result["train_images_per_s"], 2)
  result["input_over_single_threaded"] = round(
      result["input_images_per_s"] / result["single_threaded_images_per_s"], 2)
  return result


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  with tempfile.TemporaryDirectory() as work_dir:
    sides = make_sides(args, work_dir)
    print(f"{args.jpeg_size}x{args.jpeg_size} digit JPEGs -> {args.image_size}x"
          f"{args.image_size}, batch {args.batch_size}; {args.batches} timed "
          f"batches, {args.train_steps} timed training steps per run", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize(runs, args, load_start)
  for side in runs:
    print(f"{side:16} median: {result[f'{side}_images_per_s']:8.1f} images/s on "
          f"{result[f'{side}_cores_used']:.2f} cores "
          f"({result[f'{side}_images_per_cpu_s']:.1f} per CPU second)")
  print(f"input/train {result['ratio']:.2f} (target >= 3), "
        f"input/single-threaded {result['input_over_single_threaded']:.2f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
