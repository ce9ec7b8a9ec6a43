"""Images/s of the exported SavedModel on CPU vs estimator.predict, and where serving time goes.

    python benchmarks/bench_serving.py [--image_size=64] [--train_steps=20]
        [--num_images=512] [--repeats=5]

Writes the digits data set (estimator_tpu.testing) at --image_size, trains the
flowers CNN (--model=flowers) briefly with train.py's code path and exports it
with export_lib, then, in this one process and alternating which side goes
first in each repeat:

  SavedModel  serving_default, loaded once with tf.saved_model.load, fed JPEG
              bytes at batch 1, 8 and 64 (images/s; latency p50/p99 at batch 1
              over every call of every repeat)
  estimator   estimator.predict over the same JPEGs (input_pipeline's
              make_predict_input_fn, predict batch 64), timed per call as a
              caller pays it: graph building, checkpoint restore and prediction.
              `steady` also reports images/s after the first prediction arrived.

The JPEGs are the digits at twice --image_size (serving resizes them, as it
would a camera image). The breakdown at batch 64 times tf.functions over the
same bytes: decode only; decode + preprocess (export_lib.decode_batch, what
serving_default runs); the network alone (predict_images on preprocessed
images); the rest of a serving_default call is the remainder. Figures are
medians over the repeats. The last line printed is one JSON object;
`ratio` = SavedModel batch-64 images/s / estimator.predict images/s (per call);
images per CPU-second of this process are reported too, as they are less
disturbed when other processes share the cores.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from estimator_tpu import tf_startup  # before TensorFlow: keeps its start-up lines off stderr

tf_startup.install()

from absl import flags
import tensorflow as tf

from estimator_tpu import cli
from estimator_tpu import flags as flags_lib
from estimator_tpu import testing
from estimator_tpu.cli import train
from estimator_tpu.data import digits as datasets
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.export import contract
from estimator_tpu.export import saved_model as export_lib
from estimator_tpu.run import assemble

BATCH_SIZES = (1, 8, 64)
BATCH_1_IMAGES = 128
PREDICT_BATCH_SIZE = 64


def train_and_export(work_dir, image_size, train_steps):
  """Trains the flowers CNN on digits and exports it; returns (model_dir, version dir)."""
  data_dir = testing.write_digits_dataset(os.path.join(work_dir, "data"), num_train=512,
                                          num_eval=64, size=image_size)
  model_dir, export_dir = os.path.join(work_dir, "model"), os.path.join(work_dir, "export")
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values([
      "train.py", f"--data_dir={data_dir}", f"--model_dir={model_dir}", "--model=flowers",
      f"--image_size={image_size}", f"--train_steps={train_steps}",
      f"--steps_per_eval={train_steps}", "--train_batch_size=32",
      f"--eval_batch_size={PREDICT_BATCH_SIZE}", "--mode=train", "--norandom_flip",
      "--seed=1", f"--export_dir={export_dir}"])
  if train.run(flag_values) != 0:
    raise SystemExit("bench_serving: training failed")
  return model_dir, export_lib.latest_export(export_dir)


def make_jpegs(count, size):
  images, _ = datasets.digit_arrays(limit=count, size=size)
  return [datasets.encode_jpeg(image) for image in images]


def time_call(function, inputs):
  """Seconds for one call, until every output is a NumPy value."""
  start = time.perf_counter()
  outputs = function(inputs)
  for value in outputs.values() if isinstance(outputs, dict) else [outputs]:
    value.numpy()
  return time.perf_counter() - start


def time_batches(function, inputs, batch_size):
  """Runs function over inputs in batches; returns (seconds, [seconds per call])."""
  batches = [tf.constant(inputs[i:i + batch_size]) for i in range(0, len(inputs), batch_size)]
  start = time.perf_counter()
  latencies = [time_call(function, batch) for batch in batches]
  return time.perf_counter() - start, latencies


def run_saved_model(serve, jpegs):
  """One repeat: ({batch size: images/s, 'cpu': batch-64 images per CPU-second}, latencies).

  Images per CPU-second (all threads of this process) is less disturbed than
  wall time when other processes share the cores.
  """
  figures, latencies = {}, []
  for batch_size in BATCH_SIZES:
    inputs = jpegs[:BATCH_1_IMAGES] if batch_size == 1 else jpegs
    cpu_start = time.process_time()
    seconds, calls = time_batches(serve, inputs, batch_size)
    figures[batch_size] = len(inputs) / seconds
    if batch_size == 1:
      latencies = calls
    if batch_size == PREDICT_BATCH_SIZE:
      figures["cpu"] = len(inputs) / (time.process_time() - cpu_start)
  return figures, latencies


def run_estimator(estimator, jpegs, image_size):
  """One estimator.predict call: images/s per call, after the first prediction, per CPU-second."""
  input_fn = input_pipeline.make_predict_input_fn(jpegs, image_size)
  cpu_start = time.process_time()
  start = time.perf_counter()
  first = None
  count = 0
  for _ in estimator.predict(input_fn, yield_single_examples=True):
    count += 1
    if first is None:
      first = time.perf_counter()
  end = time.perf_counter()
  cpu_seconds = time.process_time() - cpu_start
  # The first batch of PREDICT_BATCH_SIZE arrives together: count the rest.
  steady = (count - PREDICT_BATCH_SIZE) / (end - first) if count > PREDICT_BATCH_SIZE else 0.0
  return {"per_call": count / (end - start), "steady": steady, "cpu": count / cpu_seconds}


def make_breakdown_functions(image_size, loaded):
  """tf.functions over a [batch] string tensor: decode, decode+preprocess; and the network."""

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def decode(image_bytes):
    # The JPEGs all have one size, so decoded images stack like preprocessed ones.
    return tf.map_fn(image_ops.decode_image, image_bytes, fn_output_signature=tf.uint8)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
  def decode_preprocess(image_bytes):
    return export_lib.decode_batch(image_bytes, image_size)

  network = loaded.signatures[contract.PREDICT_IMAGES_SIGNATURE]
  return decode, decode_preprocess, lambda images: network(images=images)


def run_breakdown(functions, serve, jpegs, calls=3):
  """Milliseconds per batch of 64 for each stage (median of `calls`) in one repeat."""
  decode, decode_preprocess, network = functions
  batch = tf.constant(jpegs[:PREDICT_BATCH_SIZE])
  images = decode_preprocess(batch)
  stages = (("decode", decode, batch), ("decode_preprocess", decode_preprocess, batch),
            ("network", network, images), ("serving_default", serve, batch))
  return {name: 1000 * statistics.median(time_call(function, inputs) for _ in range(calls))
          for name, function, inputs in stages}


def percentile(values, q):
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--image_size", type=int, default=64)
  parser.add_argument("--train_steps", type=int, default=20)
  parser.add_argument("--num_images", type=int, default=512)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  cli.quiet_tensorflow()
  with tempfile.TemporaryDirectory(prefix="bench_serving_") as work_dir:
    return measure(args, work_dir)


def measure(args, work_dir):
  start = time.perf_counter()
  model_dir, version_dir = train_and_export(work_dir, args.image_size, args.train_steps)
  print(f"trained flowers CNN {args.train_steps} steps at {args.image_size}px and exported "
        f"{version_dir} in {time.perf_counter() - start:.0f}s", flush=True)
  jpegs = make_jpegs(args.num_images, 2 * args.image_size)
  loaded = tf.saved_model.load(version_dir)
  signature = loaded.signatures[contract.SERVING_SIGNATURE]

  def serve(batch):
    return signature(image_bytes=batch)

  config, _ = assemble.prepare_export(model_dir, os.path.join(work_dir, "unused"))
  estimator = assemble.build(config)
  functions = make_breakdown_functions(args.image_size, loaded)
  run_saved_model(serve, jpegs[:PREDICT_BATCH_SIZE])  # warm-up: trace every batch size
  run_breakdown(functions, serve, jpegs)
  runs = {"saved_model": [], "estimator": [], "breakdown": []}
  latencies = []
  for repeat in range(args.repeats):
    order = ("saved_model", "estimator") if repeat % 2 == 0 else ("estimator", "saved_model")
    for side in order:
      if side == "saved_model":
        figures, calls = run_saved_model(serve, jpegs)
        runs["saved_model"].append(figures)
        latencies.extend(calls)
      else:
        runs["estimator"].append(run_estimator(estimator, jpegs, args.image_size))
    runs["breakdown"].append(run_breakdown(functions, serve, jpegs))
    sm, est = runs["saved_model"][-1], runs["estimator"][-1]
    print(f"  repeat {repeat + 1}/{args.repeats} ({' then '.join(order)}): SavedModel "
          + ", ".join(f"b{b} {sm[b]:.0f}" for b in BATCH_SIZES)
          + f" img/s; estimator.predict {est['per_call']:.0f} img/s "
          f"(steady {est['steady']:.0f})", flush=True)
  return report(args, runs, latencies)


def report(args, runs, latencies):
  """Prints the medians, the breakdown and the final JSON line."""
  median = statistics.median
  saved = {b: median(r[b] for r in runs["saved_model"]) for b in BATCH_SIZES + ("cpu",)}
  estimator, steady, estimator_cpu = (median(r[k] for r in runs["estimator"])
                                      for k in ("per_call", "steady", "cpu"))
  stages = {k: median(r[k] for r in runs["breakdown"]) for k in runs["breakdown"][0]}
  total = stages["serving_default"]
  parts = {"decode_ms": stages["decode"],
           "preprocess_ms": stages["decode_preprocess"] - stages["decode"],
           "network_ms": stages["network"],
           "other_ms": total - stages["decode_preprocess"] - stages["network"]}
  print(f"\nmedians over {args.repeats} repeats, {args.num_images} JPEGs of "
        f"{2 * args.image_size}px, flowers CNN at {args.image_size}px, CPU:")
  for b in BATCH_SIZES:
    print(f"  SavedModel serving_default batch {b:2d}: {saved[b]:8.1f} images/s")
  print(f"  batch 1 latency: p50 {1000 * percentile(latencies, 50):.2f} ms, "
        f"p99 {1000 * percentile(latencies, 99):.2f} ms ({len(latencies)} calls)")
  print(f"  estimator.predict per call:       {estimator:8.1f} images/s "
        f"(after the first prediction: {steady:.1f})")
  print(f"  images per CPU-second: SavedModel batch 64 {saved['cpu']:.1f}, "
        f"estimator.predict {estimator_cpu:.1f}")
  print(f"  one batch of 64 through serving_default: {total:.1f} ms = "
        + ", ".join(f"{k[:-3]} {v:.1f} ms ({100 * v / total:.0f}%)" for k, v in parts.items()))
  result = {
      "ratio": round(saved[64] / estimator, 3),
      "ratio_vs_estimator_steady": round(saved[64] / steady, 3) if steady else None,
      "ratio_per_cpu_second": round(saved["cpu"] / estimator_cpu, 3),
      "saved_model_images_per_sec": {str(b): round(saved[b], 1) for b in BATCH_SIZES},
      "batch1_latency_ms": {"p50": round(1000 * percentile(latencies, 50), 3),
                            "p99": round(1000 * percentile(latencies, 99), 3)},
      "estimator_predict_images_per_sec": round(estimator, 1),
      "estimator_predict_steady_images_per_sec": round(steady, 1),
      "images_per_cpu_second": {"saved_model_batch64": round(saved["cpu"], 1),
                                "estimator_predict": round(estimator_cpu, 1)},
      "batch64_breakdown_ms": {k: round(v, 2) for k, v in parts.items()},
      "model": "flowers", "image_size": args.image_size, "jpeg_size": 2 * args.image_size,
      "num_images": args.num_images, "repeats": args.repeats,
  }
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  sys.exit(main())
