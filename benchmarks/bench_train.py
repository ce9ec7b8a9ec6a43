"""Training images/s by engine and precision: TPUEstimator, the distribute and JAX engines, Keras.

    python benchmarks/bench_train.py    # ResNet-50 at 224 px, float32 and bfloat16
        [--precisions=float32,bfloat16[,float16]] [--engines=estimator,distribute,keras,jax]
        [--resnet_depth=50] [--image_size=224] [--batch_size=4] [--iterations_per_loop=1]
        [--warmup_steps=2] [--steps=2] [--repeats=5]
    python benchmarks/bench_train.py --model=flowers
        (the flowers CNN on 32 px digits: --image_size=32 --batch_size=32
        --iterations_per_loop=10 --warmup_steps=20 --steps=120)

Every side trains the project's network (networks.build_network: ResNet v1.5,
or the flowers CNN) on generated 500x375 photo records (_photos.py; the
digits written by estimator_tpu.testing for flowers), fed by the project's
training input_fn with the same global batch, with Nesterov momentum at the
same constant learning rate, the same cross-entropy and L2 weight decay, in
the same precision (--precision: float32, or Keras' mixed_bfloat16 /
mixed_float16 policy on float32 variables; float16 with dynamic loss
scaling, measured by default only where a GPU is present):
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
    opt-in counterpart of --host_loop), accuracy as a metric, no callbacks
    but the timer, no XLA (as on the estimator side), a LossScaleOptimizer
    in float16;
  jax: the same model_fn and input_fn on `--engine=jax` (each step lowered
    by TensorFlow's XLA bridge, run by JAX on its CPU device), the same
    host_call, checkpoint at the end of each train() call.
Each round is one train()/fit() call of warmup_steps + steps per side (one
side per engine and precision), the sides rotating which goes first.
Steady-state images/s times the last `steps` steps only (a SessionRunHook /
a Keras callback timestamps each session.run, call of the engine's training
function or execution, all of iterations_per_loop steps), so graph
building, tracing, session creation, checkpoints and the input pipeline's
start-up are excluded; wall images/s divides all the images by the whole
call, whose setup (call to first step) and teardown (last step to return)
are printed too. Images per CPU second (process CPU time over the window) is
reported beside images/s because a shared machine gives a process a varying
share of the cores.

The last line is one JSON object: per side `<engine>_<precision>_<figure>`;
`bfloat16_vs_float32` (and `float16_vs_float32`) the distribute engine's
steady images/s in that precision over float32's; `distribute_vs_estimator`
and `distribute_vs_keras` {precision: the distribute engine's steady images/s
over the other's} (`distribute_cpu_vs_*` per CPU second); `jax_vs_estimator`
the same of the JAX engine (`--engines=...,jax`); `ratio` jax ÷ estimator
steady images/s in float32 when the JAX engine ran, else estimator ÷ keras
(`cpu_ratio`, `wall_ratio`); each side's
model-FLOPs utilisation against the machine's float32 matmul rate; whether
the CPU has bfloat16 units and how many GPUs there are.
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
from estimator_tpu.model import precision as precision_lib


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
  """The network compiled the way model_fn trains it, in its precision; returns it."""
  params = config.to_params()
  network = networks.build_network(params)
  size = params["image_size"]
  network(tf.zeros([1, size, size, 3]))  # creates the variables
  network.add_loss(lambda: optimization.weight_decay_loss(
      network.trainable_variables, params["weight_decay"]))
  lr = float(optimization.learning_rate(tf.constant(0, tf.int64), params))
  optimizer = stacks.keras.optimizers.SGD(lr, momentum=params["momentum"], nesterov=True)
  if params["precision"] == precision_lib.FLOAT16:
    optimizer = stacks.keras.mixed_precision.LossScaleOptimizer(optimizer)
  network.compile(
      optimizer=optimizer,
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


DEFAULTS = {
    "resnet": {"image_size": 224, "batch_size": 4, "iterations_per_loop": 1,
               "warmup_steps": 2, "steps": 2},
    "flowers": {"image_size": 32, "batch_size": 32, "iterations_per_loop": 10,
                "warmup_steps": 20, "steps": 120},
}
ENGINES = ("estimator", "distribute", "keras", "jax")
PHOTO_COUNT = 64


def default_precisions():
  """float32 and bfloat16, and float16 where a GPU is present (its units compute it)."""
  gpus = tf.config.list_physical_devices("GPU")
  return "float32,bfloat16" + (",float16" if gpus else "")


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  _args.add_training_timing(parser)
  parser.add_argument("--model", choices=("flowers", "resnet"), default="resnet")
  parser.add_argument("--resnet_depth", type=int, default=50)
  parser.add_argument("--precisions", default=None,
                      help="comma-separated: float32, bfloat16, float16")
  parser.add_argument("--engines", default="estimator,distribute,keras",
                      help="comma-separated: estimator, distribute, keras, jax")
  known, _ = parser.parse_known_args()
  parser.set_defaults(**DEFAULTS[known.model])
  args = _args.check_training_timing(parser, parser.parse_args())
  args.precisions = (args.precisions or default_precisions()).split(",")
  args.engines = args.engines.split(",")
  for name, values, known_values in (("precisions", args.precisions, precision_lib.PRECISIONS),
                                     ("engines", args.engines, ENGINES)):
    unknown = sorted(set(values) - set(known_values))
    if unknown:
      parser.error(f"--{name}: {', '.join(unknown)} not one of {', '.join(known_values)}")
  return args


def report(name, repeat, figures):
  print(f"  {name:20} run {repeat + 1}: steady {figures['steady_images_per_s']:7.2f} "
        f"images/s on {figures['cores_used']:.2f} cores, wall "
        f"{figures['wall_images_per_s']:7.2f} images/s ({figures['wall_seconds']:.1f}s: "
        f"setup {figures['setup_seconds']:.1f}s, teardown "
        f"{figures['teardown_seconds']:.1f}s)", flush=True)


FIGURES = ("steady_images_per_s", "cores_used", "images_per_cpu_s", "wall_images_per_s",
           "wall_seconds", "setup_seconds", "teardown_seconds")


def _over(result, numerator, denominator, key="steady_images_per_s"):
  """result[numerator_key] / result[denominator_key], or None when a side was not run."""
  top, bottom = result.get(f"{numerator}_{key}"), result.get(f"{denominator}_{key}")
  return round(top / bottom, 3) if top and bottom else None


def summarize(runs, args, load_start, flops):
  """Medians of every side, the engines' and precisions' ratios, model-FLOPs utilisations."""
  forward, matmul_rate = flops
  result = {"model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
            "iterations_per_loop": args.iterations_per_loop,
            "warmup_steps": args.warmup_steps, "steps": args.steps,
            "repeats": args.repeats, "cpus": os.cpu_count(),
            "cpu_bfloat16_units": precision_lib.cpu_computes_bfloat16(),
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for side, side_runs in runs.items():
    for key in FIGURES:
      result[f"{side}_{key}"] = round(_common.median(side_runs, key), 3)
  for precision in ("bfloat16", "float16"):
    value = _over(result, f"distribute_{precision}", "distribute_float32")
    if value:
      result[f"{precision}_vs_float32"] = value
  for other in ("estimator", "keras"):
    for kind, key in (("", "steady_images_per_s"), ("cpu_", "images_per_cpu_s")):
      result[f"distribute_{kind}vs_{other}"] = {
          p: _over(result, f"distribute_{p}", f"{other}_{p}", key) for p in args.precisions}
  for kind, key in (("", "steady_images_per_s"), ("cpu_", "images_per_cpu_s"),
                    ("wall_", "wall_images_per_s")):
    result[f"jax_{kind}vs_estimator"] = {
        p: _over(result, f"jax_{p}", f"estimator_{p}", key) for p in args.precisions}
  for name, key in (("ratio", "steady_images_per_s"), ("cpu_ratio", "images_per_cpu_s"),
                    ("wall_ratio", "wall_images_per_s")):
    # The JAX engine's figure against the estimator's where it ran, else the estimator's
    # against Keras fit's.
    result[name] = (_over(result, "jax_float32", "estimator_float32", key)
                    if "jax" in args.engines else
                    _over(result, "estimator_float32", "keras_float32", key))
  result["forward_gflops_per_image"] = round(forward / 1e9, 3)
  result["matmul_gflops_per_s"] = round(matmul_rate / 1e9, 1)
  for side in runs:
    achieved = result[f"{side}_steady_images_per_s"] * 3 * forward
    result[f"{side}_mfu"] = round(achieved / matmul_rate, 3)
  return result


def make_data(args, work_dir):
  if args.model == "resnet":
    pattern, _ = _photos.write_photo_records(os.path.join(work_dir, "data"), PHOTO_COUNT)
    return pattern
  return _common.write_digits(os.path.join(work_dir, "data"), args.image_size)


def make_sides(args, work_dir, pattern):
  """One side per engine and precision, built and run once untimed; returns (name, fn) pairs."""
  sides = []
  b, w, n = args.batch_size, args.warmup_steps, args.steps
  for precision in args.precisions:
    config = _common.make_config(
        os.path.join(work_dir, f"estimator_{precision}"), args.image_size, args.batch_size,
        args.iterations_per_loop, model=args.model, resnet_depth=args.resnet_depth,
        host_loop=True, precision=precision)
    input_fn = _common.train_input_fn(config, pattern)
    for engine in args.engines:
      sides.append((f"{engine}_{precision}",
                    _side(engine, config, input_fn, pattern, work_dir, (b, w, n))))
  # Untimed first calls: the first checkpoints, the engine's and Keras's tracing.
  for _, fn in sides:
    fn(steps=args.iterations_per_loop)
  return sides


def _side(engine, config, input_fn, pattern, work_dir, sizes):
  """fn(steps) that runs one timed call of `engine` in config's precision."""
  b, w, n = sizes
  if engine == "keras":
    network = build_keras(config)
    dataset = keras_dataset(config, pattern)

    def run_keras(steps=n):
      restore_v2_classes(config)
      return time_keras_fit(network, dataset, b, w, steps)

    return run_keras
  if engine in ("distribute", "jax"):
    # Its own model_dir: each side resumes only its own checkpoints.
    config = config.replace("runtime", engine=engine, host_loop=False, model_dir=(
        os.path.join(work_dir, f"{engine}_{config.model.precision}"))).validate()
  estimator = _common.build_estimator(config)

  def run_estimator(steps=n):
    return _common.time_estimator_train(estimator, input_fn, b, w, steps)

  return run_estimator


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  matmul_rate = _common.matmul_flops_per_s()
  with tempfile.TemporaryDirectory() as work_dir:
    pattern = make_data(args, work_dir)
    sides = make_sides(args, work_dir, pattern)
    params = _common.make_config(work_dir, args.image_size, args.batch_size,
                                 args.iterations_per_loop, model=args.model,
                                 resnet_depth=args.resnet_depth).to_params()
    forward = _common.forward_flops(params)
    name = (f"ResNet-{args.resnet_depth}, {args.image_size}x{args.image_size} crops of "
            "500x375 photos" if args.model == "resnet" else
            f"flowers CNN, {args.image_size}x{args.image_size} digits")
    print(f"{name}, global batch {args.batch_size}, {args.warmup_steps} warm-up + "
          f"{args.steps} timed steps per call, iterations_per_loop={args.iterations_per_loop}, "
          f"{' and '.join(args.precisions)}", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  # The best of a measurement before and one after: the machine's rate, less the load of the moment.
  matmul_rate = max(matmul_rate, _common.matmul_flops_per_s())
  result = summarize(runs, args, load_start, (forward, matmul_rate))
  print_summary(result, runs)
  _common.print_json(result)


def print_summary(result, runs):
  print(f"forward pass {result['forward_gflops_per_image']:.2f} GFLOPs per image; "
        f"float32 matmul {result['matmul_gflops_per_s']:.1f} GFLOP/s; load average "
        f"{result['load_average_1min_start']} -> {result['load_average_1min_end']}")
  for side in runs:
    print(f"{side:20} median: steady {result[f'{side}_steady_images_per_s']:.2f} "
          f"images/s on {result[f'{side}_cores_used']:.2f} cores "
          f"({result[f'{side}_images_per_cpu_s']:.2f} per CPU second), "
          f"wall {result[f'{side}_wall_images_per_s']:.2f} images/s, setup "
          f"{result[f'{side}_setup_seconds']:.1f}s per call, model-FLOPs utilisation "
          f"{result[f'{side}_mfu']:.3f}")
  for precision in ("bfloat16", "float16"):
    if f"{precision}_vs_float32" in result:
      print(f"distribute engine, {precision}/float32: {result[f'{precision}_vs_float32']:.3f}")
  for other in ("estimator", "keras"):
    ratios = ", ".join(f"{p} {v:.3f}" for p, v in result[f"distribute_vs_{other}"].items() if v)
    print(f"distribute/{other}: steady {ratios or 'not run'}")
  ratios = ", ".join(f"{p} {v:.3f}" for p, v in result["jax_vs_estimator"].items() if v)
  print(f"jax/estimator: steady {ratios or 'not run'}")


if __name__ == "__main__":
  main()
