"""Images/s and peak memory of the Beam preprocessing vs a plain Python loop, or on Dask.

    python benchmarks/bench_preprocess.py [--sizes=1000,10000] [--repeats=5,3]
    python benchmarks/bench_preprocess.py --runner=dask [--sizes=2000,20000] [--repeats=5,3]

Writes N photo-like 320x240 JPEGs in 10 class folders, then runs, each in its
own subprocess and alternating which goes first, (a) the Beam pipeline with
preprocess.py's default options and (b) one Python process doing the same
per-image work in a loop (read, decode to validate, build the tf.Example,
write TFRecord shards). Times exclude the interpreter and TensorFlow start-up
of the measured process itself (both sides pay it); Beam's worker start-up is
included. Memory is the peak of the summed RSS of the process and all its
children (sampled every 50 ms) plus each process's own high-water mark.
The last line printed is one JSON object; `ratio` is Beam/plain images/s at
the largest N.

With --runner=dask the two sides are the pipeline on Beam's DaskRunner
against a dask.distributed cluster of 2 single-threaded worker processes on
127.0.0.1 (started by the benchmark, warmed up with one small run so that
the workers have imported TensorFlow) and the pipeline on the DirectRunner
with preprocess.py's defaults (threads on every core). `ratio` is
Dask/Direct images/s at the largest N; the driver's own peak memory (the
process that builds and submits the pipeline) is given at each N.
"""

# The parent process only times children; TensorFlow loads in the children.
import argparse
import concurrent.futures
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from estimator_tpu.beam import encode
from estimator_tpu.data import layout

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

WIDTH, HEIGHT = 320, 240
NUM_CLASSES = 10


def _write_range(out_dir, start, stop):
  """Writes photo-like JPEGs start..stop-1 (gradients + a blob + noise)."""
  import numpy as np

  from estimator_tpu.data import digits as datasets
  y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
  for i in range(start, stop):
    rng = np.random.default_rng(i)
    a, b, cx, cy, r = rng.uniform(0, 1, 5)
    base = (a * x / WIDTH + b * y / HEIGHT) * 180
    blob = 70 * np.exp(-((x - cx * WIDTH) ** 2 + (y - cy * HEIGHT) ** 2)
                       / (2 * (20 + 60 * r) ** 2))
    tint = rng.uniform(0.5, 1.0, 3).astype(np.float32)
    image = (base + blob)[..., None] * tint
    image += rng.normal(0, 6, image.shape).astype(np.float32)
    jpeg = datasets.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8), 90)
    with open(os.path.join(out_dir, f"class_{i % NUM_CLASSES}",
                           f"{i:06d}.jpg"), "wb") as f:
      f.write(jpeg)


def write_images(out_dir, count):
  """Writes `count` 320x240 JPEGs in NUM_CLASSES class folders, all cores."""
  for c in range(NUM_CLASSES):
    os.makedirs(os.path.join(out_dir, f"class_{c}"), exist_ok=True)
  step = 500
  with concurrent.futures.ProcessPoolExecutor() as pool:
    list(pool.map(_write_range, [out_dir] * (count // step + 1),
                  range(0, count, step),
                  [min(i + step, count) for i in range(0, count, step)]))


def _plan(input_dir, output_dir):
  from estimator_tpu.beam import sources as preprocess_inputs
  return preprocess_inputs.make_plan(output_dir, input_dir=input_dir)


def run_beam(input_dir, output_dir, extra_args=()):
  """The pipeline as preprocess.py runs it with no Beam flags."""
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions

  from estimator_tpu.beam import options as preprocess_flags
  from estimator_tpu.beam import pipeline as beam_pipeline
  plan = _plan(input_dir, output_dir)
  options = PipelineOptions(preprocess_flags.with_defaults(list(extra_args)))
  with beam.Pipeline(options=options) as p:
    beam_pipeline.build_pipeline(p, plan)
  return len(plan.items)


def run_plain(input_dir, output_dir):
  """The same per-image work in one process, no Beam."""
  import tensorflow as tf

  from estimator_tpu.beam import plan as plan_lib
  plan = _plan(input_dir, output_dir)
  os.makedirs(output_dir, exist_ok=True)
  writers = {(split, shard): tf.io.TFRecordWriter(os.path.join(
      output_dir, layout.shard_name(split, shard, count)))
             for split, count in plan.num_shards.items()
             for shard in range(count)}
  written = 0
  for item in plan.items:
    try:
      encoded = encode.encode_example(encode.read_file(item.path), item.label,
                                  item.class_name, item.path)
    except plan_lib.RejectedInput:
      continue
    writers[(item.split, item.shard)].write(encoded.serialized)
    written += 1
  for writer in writers.values():
    writer.close()
  return written


def _child_main(side, input_dir, output_dir, extra_args):
  """Runs one side in this process; prints its figures as JSON."""
  start, cpu = time.perf_counter(), _cpu_seconds()
  if side == "beam":
    count = run_beam(input_dir, output_dir, extra_args)
  else:
    count = run_plain(input_dir, output_dir)
  seconds = time.perf_counter() - start
  print(json.dumps({
      "count": count, "seconds": seconds, "cpu_seconds": _cpu_seconds() - cpu,
      "self_hwm_mb":
          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _cpu_seconds():
  """User + system CPU of this process and its reaped children (workers)."""
  total = 0.0
  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
    usage = resource.getrusage(who)
    total += usage.ru_utime + usage.ru_stime
  return total


def _descendants_rss_kb(pid):
  """Summed VmRSS of pid and all its descendants (Linux /proc)."""
  parents = {}
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          fields = f.read().rsplit(")", 1)[1].split()
        parents.setdefault(int(fields[1]), []).append(int(entry))
      except OSError:
        continue
  total, stack = 0, [pid]
  while stack:
    current = stack.pop()
    stack.extend(parents.get(current, []))
    try:
      with open(f"/proc/{current}/status") as f:
        for line in f:
          if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    except OSError:
      continue
  return total


def measure(side, input_dir, extra_args=()):
  """Runs one side ("beam" or "plain") in a subprocess; returns its figures."""
  with tempfile.TemporaryDirectory() as output_dir:
    cmd = [sys.executable, os.path.abspath(__file__), f"--child={side}",
           f"--input_dir={input_dir}", f"--output_dir={output_dir}/out"]
    cmd += [f"--beam_arg={a}" for a in extra_args]
    wall = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    peak = [0]
    def sample():
      while proc.poll() is None:
        peak[0] = max(peak[0], _descendants_rss_kb(proc.pid))
        time.sleep(0.05)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    if proc.returncode:
      raise RuntimeError(f"{side} run failed with status {proc.returncode}")
    figures = json.loads(out.strip().splitlines()[-1])
  figures["wall_seconds"] = time.perf_counter() - wall
  figures["tree_peak_mb"] = peak[0] / 1024
  figures["images_per_s"] = figures["count"] / figures["seconds"]
  return figures


def _median(runs, key):
  return round(statistics.median(r[key] for r in runs), 2)


def bench_size(count, repeats, sides, work_dir):
  """Alternating repeats at one N; returns the medians.

  Args:
    count: images to write and preprocess.
    repeats: runs per side.
    sides: {name: (child side, extra Beam args)}, two of them; the first is
      the ratio's numerator.
    work_dir: where the images go.
  """
  input_dir = os.path.join(work_dir, f"images_{count}")
  start = time.perf_counter()
  write_images(input_dir, count)
  print(f"N={count}: wrote images in {time.perf_counter() - start:.1f}s",
        flush=True)
  names = list(sides)
  runs = {name: [] for name in names}
  for repeat in range(repeats):
    order = names if repeat % 2 == 0 else names[::-1]
    for name in order:
      child, extra_args = sides[name]
      runs[name].append(measure(child, input_dir, extra_args))
      r = runs[name][-1]
      print(f"  N={count} {name:6} run {repeat + 1}/{repeats}: "
            f"{r['images_per_s']:7.1f} images/s, {r['seconds']:.2f}s "
            f"(wall {r['wall_seconds']:.2f}s), tree peak "
            f"{r['tree_peak_mb']:.0f} MB, driver peak {r['self_hwm_mb']:.0f} MB", flush=True)
  result = {"n": count, "repeats": repeats}
  for name, side_runs in runs.items():
    for key in ("images_per_s", "seconds", "cpu_seconds", "wall_seconds",
                "tree_peak_mb", "self_hwm_mb"):
      result[f"{name}_{key}"] = _median(side_runs, key)
  first, second = names
  result["ratio"] = round(result[f"{first}_images_per_s"]
                          / result[f"{second}_images_per_s"], 3)
  result["wall_ratio"] = round(result[f"{second}_wall_seconds"]
                               / result[f"{first}_wall_seconds"], 3)
  return result


def _bench_plain(args, sizes, repeats):
  sides = {"beam": ("beam", args.beam_arg), "plain": ("plain", [])}
  results = []
  with tempfile.TemporaryDirectory() as work_dir:
    for count, repeat in zip(sizes, repeats):
      results.append(bench_size(count, repeat, sides, work_dir))
  last, first = results[-1], results[0]
  return {
      "ratio": last["ratio"], "n": last["n"], "cpus": os.cpu_count(),
      "load_average_1m": round(os.getloadavg()[0], 2),
      "beam_args": args.beam_arg or "preprocess.py defaults",
      "beam_peak_mb_growth": round(last["beam_tree_peak_mb"]
                                   - first["beam_tree_peak_mb"], 1),
      "plain_peak_mb_growth": round(last["plain_tree_peak_mb"]
                                    - first["plain_tree_peak_mb"], 1),
      "by_n": results}


def _bench_dask(args, sizes, repeats):
  from estimator_tpu.beam import dask_cluster
  results = []
  with tempfile.TemporaryDirectory() as work_dir, \
      dask_cluster.local_cluster(args.dask_workers, cwd=_ROOT) as address:
    dask_args = ["--runner=DaskRunner", f"--dask_client_address={address}", *args.beam_arg]
    sides = {"dask": ("beam", dask_args), "direct": ("beam", [])}
    print(f"dask cluster: {args.dask_workers} single-threaded workers at {address}",
          flush=True)
    warm_dir = os.path.join(work_dir, "warm_up")
    write_images(warm_dir, 100)
    measure("beam", warm_dir, dask_args)  # The workers import TensorFlow.
    for count, repeat in zip(sizes, repeats):
      results.append(bench_size(count, repeat, sides, work_dir))
  last, first = results[-1], results[0]
  return {
      "ratio": last["ratio"], "n": last["n"], "cpus": os.cpu_count(),
      "dask_workers": args.dask_workers,
      "load_average_1m": round(os.getloadavg()[0], 2),
      "driver_peak_mb": {str(r["n"]): r["dask_self_hwm_mb"] for r in results},
      "driver_peak_mb_growth": round(last["dask_self_hwm_mb"]
                                     - first["dask_self_hwm_mb"], 1),
      "direct_peak_mb_growth": round(last["direct_tree_peak_mb"]
                                     - first["direct_tree_peak_mb"], 1),
      "by_n": results}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runner", choices=["plain", "dask"], default="plain",
                      help="plain: Beam (DirectRunner) vs a plain loop; dask: "
                      "Beam on a local Dask cluster vs the DirectRunner")
  parser.add_argument("--sizes", default=None,
                      help="default 1000,10000 (plain) or 2000,20000 (dask)")
  parser.add_argument("--repeats", default="5,3",
                      help="repeats per size, comma-separated")
  parser.add_argument("--dask_workers", type=int, default=2)
  parser.add_argument("--beam_arg", action="append", default=[],
                      help="extra Beam option, e.g. "
                      "--beam_arg=--direct_running_mode=multi_threading")
  parser.add_argument("--child", choices=["beam", "plain"],
                      help=argparse.SUPPRESS)
  parser.add_argument("--input_dir", help=argparse.SUPPRESS)
  parser.add_argument("--output_dir", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return _child_main(args.child, args.input_dir, args.output_dir,
                       args.beam_arg)
  sizes = args.sizes or ("2000,20000" if args.runner == "dask" else "1000,10000")
  sizes = [int(s) for s in sizes.split(",")]
  repeats = [int(r) for r in args.repeats.split(",")]
  repeats += repeats[-1:] * (len(sizes) - len(repeats))
  bench = _bench_dask if args.runner == "dask" else _bench_plain
  print(json.dumps(bench(args, sizes, repeats)))


if __name__ == "__main__":
  main()
