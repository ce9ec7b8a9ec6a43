"""Training images/s: TPUEstimator, the distribute engine and Keras fit, same network and data.

    python benchmarks/bench_train.py [--image_size=32] [--batch_size=32]
        [--iterations_per_loop=10] [--warmup_steps=20] [--steps=120] [--repeats=5]
    python benchmarks/bench_train.py --model=resnet [--resnet_depth=50]
        (defaults then: --image_size=224 --batch_size=4 --iterations_per_loop=1
        --warmup_steps=3 --steps=4)

All three sides train the flowers CNN (networks.build_network) on the digits written
by estimator_tpu.testing, fed by the project's training input_fn with the same
global batch, with Nesterov momentum at the same constant learning rate, the
same cross-entropy and the same L2 weight decay:
  estimator: estimator.build_estimator + model_fn.model_fn (host_call
    summaries every step, logging and step-counter hooks, checkpoint at the
    end of each train() call), as `train.py --host_loop` runs it on CPU:
    iterations_per_loop steps per session.run (engines/host_loop.py; with
    iterations_per_loop=1, as train.py runs by default);
  distribute: the same model_fn and input_fn on `--engine=distribute`
    (distribute_engine.py, the default strategy on the CPU, no XLA):
    iterations_per_loop steps per call of its training tf.function, the same
    host_call, checkpoint at the end of each train() call;
  keras: Model.fit with steps_per_execution = iterations_per_loop (Keras'
    opt-in counterpart of --host_loop), accuracy
    as a metric, no callbacks but the timer, no XLA (as on the estimator side).
Each repeat is one train()/fit() call of warmup_steps + steps per side, the
sides rotating which goes first. Steady-state images/s times the last `steps`
steps only (a SessionRunHook / a Keras callback timestamps each session.run,
call of the engine's training function or execution, all of
iterations_per_loop steps), so graph building, tracing, session creation,
checkpoints and the input pipeline's start-up are excluded; wall
images/s divides all the images by the whole call, whose setup (call to first
step) and teardown (last step to return) are printed too. Images per CPU
second (process CPU time over the window) is reported beside images/s because
a shared machine gives a process a varying share of the cores. The last line
is one JSON object; `ratio` is estimator ÷ keras steady-state images/s,
`cpu_ratio` the same per CPU second; `distribute_vs_keras` and
`distribute_vs_estimator` the distribute engine's steady images/s over the
others' (`_cpu_` variants per CPU second).

With --model=resnet the network is the project's ResNet (networks.ResNet,
--resnet_depth) on generated 500x375 photo records (_photos.py) at
--image_size. Every side also reports model-FLOPs utilisation: steady images/s
x 3 x the forward pass's FLOPs (TF profiler count) ÷ the machine's float32
matmul rate (the better of a measurement before and one after the runs).
"""

import argparse
import os
import tempfile
import time

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _args
import _common
import _photos
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.model import networks
from estimator_tpu.model import optimization


class ExecutionTimer(stacks.keras.callbacks.Callback):
  """Records {last step index: clocks()} after every train_function execution."""

  def __init__(self):
    super().__init__()
    self.train_begin = None
    self.marks = {}

  def on_train_begin(self, logs=None):
    self.train_begin = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.marks[batch] = _common.clocks()


def build_keras(config):
  """The flowers CNN compiled the way model_fn trains it; returns the network."""
  params = config.to_params()
  network = networks.build_network(params)
  size = params["image_size"]
  network(tf.zeros([1, size, size, 3]))  # creates the variables
  network.add_loss(lambda: optimization.weight_decay_loss(
      network.trainable_variables, params["weight_decay"]))
  lr = float(optimization.learning_rate(tf.constant(0, tf.int64), params))
  network.compile(
      optimizer=stacks.keras.optimizers.SGD(lr, momentum=params["momentum"],
                                        nesterov=True),
      loss=stacks.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy"],
      steps_per_execution=params["iterations_per_loop"],
      jit_compile=False)
  return network


def keras_dataset(config, file_pattern):
  """The project's input_fn with {'batch_size': B}, mapped to (image, label)."""
  dataset = _common.train_input_fn(config, file_pattern)(
      {"batch_size": config.train.train_batch_size})
  return dataset.map(lambda feats, labels: (feats["image"], labels))


def restore_v2_classes(config):
  """Makes the network classes Keras-v2 again after an estimator built them in a graph.

  Keras picks v1 or v2 training code by rewriting the *class's* bases each time
  a model is constructed (version_utils.swap_class): building the network
  inside the estimator's graph turns every FlowersCNN, ours included, into a
  v1 model whose fit() refuses to run. Constructing a throwaway instance
  eagerly swaps the bases back; it creates no variables.
  """
  networks.build_network(config.to_params())


def time_keras_fit(network, dataset, batch_size, warmup_steps, steps):
  """One fit() of warmup_steps + steps; figures as time_estimator_train's."""
  timer = ExecutionTimer()
  start = time.perf_counter()
  network.fit(dataset, epochs=1, steps_per_epoch=warmup_steps + steps,
              callbacks=[timer], verbose=0)
  end = time.perf_counter()
  return _common.call_figures(
      (start, timer.train_begin, end), timer.marks[warmup_steps - 1],
      timer.marks[warmup_steps + steps - 1], batch_size, (warmup_steps, steps))


RESNET_DEFAULTS = {"image_size": 224, "batch_size": 4, "iterations_per_loop": 1,
                   "warmup_steps": 3, "steps": 4}
PHOTO_COUNT = 64


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  _args.add_training_timing(parser)
  parser.add_argument("--model", choices=("flowers", "resnet"), default="flowers")
  parser.add_argument("--resnet_depth", type=int, default=50)
  known, _ = parser.parse_known_args()
  if known.model == "resnet":
    parser.set_defaults(**RESNET_DEFAULTS)
  return _args.check_training_timing(parser, parser.parse_args())


def report(name, repeat, figures):
  print(f"  {name:10} run {repeat + 1}: steady {figures['steady_images_per_s']:7.1f} "
        f"images/s on {figures['cores_used']:.2f} cores, wall "
        f"{figures['wall_images_per_s']:7.1f} images/s ({figures['wall_seconds']:.1f}s: "
        f"setup {figures['setup_seconds']:.1f}s, teardown "
        f"{figures['teardown_seconds']:.1f}s)", flush=True)


def summarize(runs, args, load_start, flops):
  """Medians of every side, their ratios and model-FLOPs utilisations."""
  forward, matmul_rate = flops
  result = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
            "iterations_per_loop": args.iterations_per_loop,
            "warmup_steps": args.warmup_steps, "steps": args.steps,
            "repeats": args.repeats, "cpus": os.cpu_count(),
            "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for side, side_runs in runs.items():
    for key in ("steady_images_per_s", "cores_used", "images_per_cpu_s",
                "wall_images_per_s", "wall_seconds", "setup_seconds",
                "teardown_seconds"):
      result[f"{side}_{key}"] = round(_common.median(side_runs, key), 2)
  result["ratio"] = round(result["estimator_steady_images_per_s"]
                          / result["keras_steady_images_per_s"], 3)
  result["cpu_ratio"] = round(result["estimator_images_per_cpu_s"]
                              / result["keras_images_per_cpu_s"], 3)
  result["wall_ratio"] = round(result["estimator_wall_images_per_s"]
                               / result["keras_wall_images_per_s"], 3)
  for other in ("keras", "estimator"):
    result[f"distribute_vs_{other}"] = round(result["distribute_steady_images_per_s"]
                                             / result[f"{other}_steady_images_per_s"], 3)
    result[f"distribute_cpu_vs_{other}"] = round(result["distribute_images_per_cpu_s"]
                                                 / result[f"{other}_images_per_cpu_s"], 3)
  result["distribute_wall_vs_keras"] = round(result["distribute_wall_images_per_s"]
                                             / result["keras_wall_images_per_s"], 3)
  result["forward_gflops_per_image"] = round(forward / 1e9, 3)
  result["matmul_gflops_per_s"] = round(matmul_rate / 1e9, 1)
  for side in runs:
    achieved = result[f"{side}_steady_images_per_s"] * 3 * forward
    result[f"{side}_mfu"] = round(achieved / matmul_rate, 3)
  return result


def make_sides(args, work_dir):
  """The three sides, built and run once untimed; returns the (name, fn) pairs."""
  if args.model == "resnet":
    pattern, _ = _photos.write_photo_records(os.path.join(work_dir, "data"), PHOTO_COUNT)
  else:
    pattern = _common.write_digits(os.path.join(work_dir, "data"), args.image_size)
  config = _common.make_config(os.path.join(work_dir, "model"), args.image_size,
                               args.batch_size, args.iterations_per_loop,
                               model=args.model, resnet_depth=args.resnet_depth,
                               host_loop=True)
  estimator = _common.build_estimator(config)
  # Its own model_dir: each side resumes only its own checkpoints.
  engine = _common.build_estimator(config.replace(
      "runtime", engine="distribute", model_dir=os.path.join(work_dir, "distribute"),
      host_loop=False).validate())
  input_fn = _common.train_input_fn(config, pattern)
  network = build_keras(config)
  dataset = keras_dataset(config, pattern)
  b, w, n = args.batch_size, args.warmup_steps, args.steps

  def run_estimator(steps=n):
    return _common.time_estimator_train(estimator, input_fn, b, w, steps)

  def run_distribute(steps=n):
    return _common.time_estimator_train(engine, input_fn, b, w, steps)

  def run_keras(steps=n):
    restore_v2_classes(config)
    return time_keras_fit(network, dataset, b, w, steps)

  # Untimed first calls: the first checkpoints, the engine's and Keras's tracing.
  run_estimator(steps=args.iterations_per_loop)
  run_distribute(steps=args.iterations_per_loop)
  run_keras(steps=args.iterations_per_loop)
  return [("estimator", run_estimator), ("distribute", run_distribute),
          ("keras", run_keras)], config


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  matmul_rate = _common.matmul_flops_per_s()
  with tempfile.TemporaryDirectory() as work_dir:
    sides, config = make_sides(args, work_dir)
    forward = _common.forward_flops(config.to_params())
    name = (f"ResNet-{args.resnet_depth}, {args.image_size}x{args.image_size} crops of "
            "500x375 photos" if args.model == "resnet" else
            f"flowers CNN, {args.image_size}x{args.image_size} digits")
    print(f"{name}, global batch "
          f"{args.batch_size}, {args.warmup_steps} warm-up + {args.steps} timed "
          f"steps per call, iterations_per_loop={args.iterations_per_loop}",
          flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  # The best of a measurement before and one after: the machine's rate, less the load of the moment.
  matmul_rate = max(matmul_rate, _common.matmul_flops_per_s())
  result = summarize(runs, args, load_start, (forward, matmul_rate))
  print(f"forward pass {result['forward_gflops_per_image']:.2f} GFLOPs per image; "
        f"float32 matmul {result['matmul_gflops_per_s']:.1f} GFLOP/s")
  for side in ("estimator", "distribute", "keras"):
    print(f"{side:10} median: steady {result[f'{side}_steady_images_per_s']:.1f} "
          f"images/s on {result[f'{side}_cores_used']:.2f} cores "
          f"({result[f'{side}_images_per_cpu_s']:.1f} per CPU second), "
          f"wall {result[f'{side}_wall_images_per_s']:.1f} images/s, setup "
          f"{result[f'{side}_setup_seconds']:.1f}s, teardown "
          f"{result[f'{side}_teardown_seconds']:.1f}s per call, model-FLOPs "
          f"utilisation {result[f'{side}_mfu']:.3f}")
  target = 0.95 if args.model == "resnet" else 1.0
  print(f"estimator/keras: steady {result['ratio']:.3f} (target >= {target}), "
        f"per CPU second {result['cpu_ratio']:.3f}, wall {result['wall_ratio']:.3f}")
  print(f"distribute/keras: steady {result['distribute_vs_keras']:.3f} (target >= 1.0), "
        f"per CPU second {result['distribute_cpu_vs_keras']:.3f}, wall "
        f"{result['distribute_wall_vs_keras']:.3f}; distribute/estimator: steady "
        f"{result['distribute_vs_estimator']:.3f}, per CPU second "
        f"{result['distribute_cpu_vs_estimator']:.3f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
