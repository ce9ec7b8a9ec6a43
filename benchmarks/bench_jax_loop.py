"""How the JAX engine runs iterations_per_loop steps: one program (lax.scan) or steps dispatched.

    python benchmarks/bench_jax_loop.py [--model=flowers|resnet] [--image_size=32]
        [--batch_size=8] [--steps=4] [--repeats=5]

The JAX engine's training step of the project's network (TensorFlow's lowering
of the model_fn's step, `estimator_tpu.engines.jax.portable`), run for
`--steps` steps per call two ways, on whatever device JAX has:
  dispatched: one jitted step per step, called back to back without waiting,
    the variables donated (what the engine does);
  scan: the steps as one program, a `lax.scan` over the stacked batches.
Each repeat times one call of each (warm: compiled before), the two
alternating which goes first; the figures are medians of the repeats.

The last line is one JSON object: images/s of each way, and `ratio` =
dispatched ÷ scan.
"""

import argparse
import os
import tempfile
import time

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import jax
import numpy as np
import tensorflow as tf

from estimator_tpu.engines.jax import portable


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=("flowers", "resnet"), default="flowers")
  parser.add_argument("--resnet_depth", type=int, default=18)
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  return parser.parse_args()


def fixed_input_fn(size):
  def input_fn(params):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(64, size, size, 3)).astype(np.float32)
    labels = rng.integers(0, _common.NUM_CLASSES, size=64).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)
  return input_fn


def make_step(args, work_dir):
  config = _common.make_config(work_dir, args.image_size, args.batch_size, 1, model=args.model,
                               resnet_depth=args.resnet_depth).replace(
      "runtime", engine="jax", strategy="one_device").validate()
  return portable.PortableTrainStep(_common.build_estimator(config),
                                    fixed_input_fn(args.image_size))


def main():
  args = parse_args()
  _common.quiet_tf()
  with tempfile.TemporaryDirectory() as work_dir:
    step = make_step(args, work_dir)
    state = tuple(jax.numpy.asarray(np.asarray(v).astype(a.dtype))
                  for v, a in zip(step.tf_state(), step.state_avals))
    batches = [step.next_batch() for _ in range(args.steps)]
    stacked = [np.stack(leaves) for leaves in zip(*batches)]
    one = jax.jit(step.fn, donate_argnums=0)

    def dispatched(state):
      for batch in batches:
        state, loss = one(state, batch)
      return state, loss

    def body(state, batch):
      return step.fn(state, batch)

    scan = jax.jit(lambda state, xs: jax.lax.scan(body, state, xs), donate_argnums=0)
    ways = {"dispatched": lambda s: dispatched(s), "scan": lambda s: scan(s, stacked)}
    for way in ways.values():  # compiled, warm
      state = jax.block_until_ready(way(state))[0]
    times = {name: [] for name in ways}
    for repeat in range(args.repeats):
      for name in (list(ways) if repeat % 2 == 0 else list(reversed(ways))):
        start = time.perf_counter()
        state = jax.block_until_ready(ways[name](state))[0]
        times[name].append(time.perf_counter() - start)
        print(f"  {name:10} run {repeat + 1}: {times[name][-1]:.3f}s for {args.steps} steps",
              flush=True)
  images = args.steps * args.batch_size
  result = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
            "steps": args.steps, "repeats": args.repeats, "platform": jax.default_backend(),
            "cpus": os.cpu_count()}
  for name, values in times.items():
    result[f"{name}_images_per_s"] = round(images / float(np.median(values)), 2)
  result["ratio"] = round(result["dispatched_images_per_s"] / result["scan_images_per_s"], 3)
  _common.print_json(result)


if __name__ == "__main__":
  main()
