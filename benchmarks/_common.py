"""Shared helpers of the training and input benchmarks: quiet TF, data, config, timing, JSON.

Import this module before TensorFlow: it sets TF_CPP_MIN_LOG_LEVEL first.
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from estimator_tpu import tf_startup  # before TensorFlow: keeps its start-up lines off stderr

tf_startup.install()

import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import testing
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.engines import host_loop

NUM_CLASSES = 10
MAX_DIGITS = 1797  # all of scikit-learn's digits
NUM_EVAL = 37
# Never checkpoint inside a timed window: only the save at the end of each train().
NO_PERIODIC_CHECKPOINTS = 10 ** 9


def quiet_tf():
  """Keeps TensorFlow's Python log output to errors."""
  tf.get_logger().setLevel("ERROR")


def write_digits(out_dir, jpeg_size):
  """Writes all digits as jpeg_size JPEGs; returns the training file pattern."""
  testing.write_digits_dataset(out_dir, num_train=MAX_DIGITS - NUM_EVAL,
                               num_eval=NUM_EVAL, size=jpeg_size, train_shards=4)
  return os.path.join(out_dir, "train-*")


def make_config(model_dir, image_size, batch_size, iterations_per_loop,
                train_steps=100000, model="flowers", resnet_depth=50, host_loop=False,
                precision="float32"):
  """A validated Config: flowers CNN (or ResNet), momentum at a constant learning rate.

  A constant schedule makes the learning rate one number both sides share:
  base_learning_rate x batch_size / 256.
  """
  return (config_lib.Config()
          .replace("data", image_size=image_size, num_label_classes=NUM_CLASSES,
                   class_names=tuple(str(i) for i in range(NUM_CLASSES)),
                   random_flip=False)
          .replace("model", model=model, resnet_depth=resnet_depth, precision=precision)
          .replace("train", train_steps=train_steps, train_batch_size=batch_size,
                   lr_schedule="constant", seed=1,
                   save_checkpoints_steps=NO_PERIODIC_CHECKPOINTS)
          .replace("runtime", model_dir=model_dir, use_tpu=False,
                   iterations_per_loop=iterations_per_loop, host_loop=host_loop)
          .validate())


def train_input_fn(config, file_pattern):
  """The project's training input_fn for config."""
  return input_pipeline.make_input_fn(
      file_pattern, True, config.data.image_size,
      random_flip=config.data.random_flip, seed=config.train.seed or None,
      deterministic=config.train.deterministic)


def forward_flops(params):
  """Floating-point operations of one image's forward pass through params' network.

  Counted by the TF profiler over a graph of the network at batch 1 (a
  multiply-add is 2); training costs about 3x this (forward, two backward).
  """
  from estimator_tpu.model import networks
  graph = tf.Graph()
  with graph.as_default():
    size = params["image_size"]
    network = networks.build_network(params)
    network(tf.compat.v1.placeholder(tf.float32, [1, size, size, 3]), training=False)
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def matmul_flops_per_s(n=2048, repeats=7):
  """The machine's float32 matmul rate: median over repeats of an n x n x n product."""
  a = tf.random.uniform([n, n])
  product = tf.function(lambda x: tf.reduce_sum(tf.matmul(x, x)))
  product(a).numpy()  # trace and warm up
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    product(a).numpy()
    seconds.append(time.perf_counter() - start)
  return 2 * n ** 3 / statistics.median(seconds)


def clocks():
  """(wall seconds, this process's CPU seconds over all its threads)."""
  return time.perf_counter(), time.process_time()


def window_figures(start, end, images):
  """Images/s, CPU cores used and images per CPU second between two clocks().

  The machine may be shared: images per CPU second is less sensitive to how
  much of the cores the scheduler gave this process than images/s.
  """
  seconds, cpu_seconds = end[0] - start[0], end[1] - start[1]
  return {"images_per_s": images / seconds,
          "cores_used": cpu_seconds / seconds,
          "images_per_cpu_s": images / cpu_seconds}


def load_average():
  """The 1-minute load average: other processes compete for the same cores."""
  return round(os.getloadavg()[0], 2)


class StepTimerHook(tf.compat.v1.train.SessionRunHook):
  """Records clocks() when the session is ready and after every session.run.

  On --engine=distribute and --engine=jax: when the training step is traced
  and the checkpoint restored, and after every step of each call of
  iterations_per_loop steps (the engines replay the hooks of a call's steps
  when it returns, so the last step's mark is the call's end). TPUEstimator's
  host loop also calls its hooks once per step, after each session.run.
  """

  def __init__(self):
    self.session_ready = None
    self.marks = []

  def after_create_session(self, session, coord):
    del session, coord
    self.session_ready = time.perf_counter()

  def after_run(self, run_context, run_values):
    del run_context, run_values
    self.marks.append(clocks())


def time_estimator_train(estimator, input_fn, batch_size, warmup_steps, steps):
  """One estimator.train() of warmup_steps + steps; returns its figures.

  The steady-state window runs from the end of step warmup_steps to the end of
  the last step, so graph building, session creation, checkpoint restore and
  save, and the input pipeline's start (shuffle buffer fill) lie outside it.
  Off TPU a session.run is iterations_per_loop steps (host_loop.py), as is a
  call of the distribute engine's training function: both counts must be
  multiples of it.

  Returns:
    The dict of call_figures().
  """
  per_run = max(host_loop.steps_per_run(estimator), getattr(estimator, "host_loop_iterations", 1))
  if warmup_steps % per_run or steps % per_run:
    raise ValueError(f"warm-up {warmup_steps} and timed {steps} steps must be multiples "
                     f"of the {per_run} steps per session.run")
  hook = StepTimerHook()
  start = time.perf_counter()
  estimator.train(input_fn, steps=warmup_steps + steps, hooks=[hook])
  end = time.perf_counter()
  total = warmup_steps + steps
  # One mark per step (the hooks of every step), or one per run of per_run steps.
  if len(hook.marks) == total:
    window_start = hook.marks[warmup_steps - 1]
  elif len(hook.marks) == total // per_run:
    window_start = hook.marks[warmup_steps // per_run - 1]
  else:
    raise RuntimeError(f"expected {total} steps in runs of {per_run}, the hook saw "
                       f"{len(hook.marks)} runs")
  return call_figures((start, hook.session_ready, end), window_start, hook.marks[-1],
                      batch_size, (warmup_steps, steps))


def call_figures(times, window_start, window_end, batch_size, step_counts):
  """The figures of one timed train()/fit() call.

  Args:
    times: perf_counter() at the call, when the first step could start
      (session created / fit's train begin) and at the return.
    window_start: clocks() after the last warm-up step.
    window_end: clocks() after the last step.
    batch_size: global batch.
    step_counts: (warm-up steps, timed steps).

  Returns:
    dict: `steady_images_per_s`, `cores_used` and `images_per_cpu_s` of the
    window; `wall_images_per_s` (all steps over the whole call),
    `wall_seconds`, `setup_seconds` (call to first step: graph, session,
    checkpoint restore) and `teardown_seconds` (last step to return:
    checkpoint save, closing).
  """
  start, ready, end = times
  warmup_steps, steps = step_counts
  steady = window_figures(window_start, window_end, steps * batch_size)
  return {"steady_images_per_s": steady["images_per_s"],
          "cores_used": steady["cores_used"],
          "images_per_cpu_s": steady["images_per_cpu_s"],
          "wall_images_per_s": (warmup_steps + steps) * batch_size / (end - start),
          "wall_seconds": end - start,
          "setup_seconds": ready - start,
          "teardown_seconds": end - window_end[0]}


def build_estimator(config):
  """The project's TPUEstimator (use_tpu=False) for config."""
  return estimator_lib.build_estimator(
      config, class_names=config.data.class_names)


def median(runs, key):
  """Median of runs[i][key]."""
  return statistics.median(run[key] for run in runs)


def alternate(sides, repeats, report):
  """Runs each side `repeats` times, rotating which goes first; returns {name: [figures]}.

  Args:
    sides: list of (name, fn) where fn() returns a dict of figures.
    repeats: rounds; round r starts with side r % len(sides).
    report: report(name, round, figures), called after every run.
  """
  runs = {name: [] for name, _ in sides}
  for repeat in range(repeats):
    shift = repeat % len(sides)
    for name, fn in sides[shift:] + sides[:shift]:
      figures = fn()
      runs[name].append(figures)
      report(name, repeat, figures)
  return runs


def print_json(figures):
  """Prints figures as the one-line JSON object that ends every benchmark."""
  print(json.dumps(figures, sort_keys=True), flush=True)
