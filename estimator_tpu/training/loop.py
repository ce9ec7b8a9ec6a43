"""The hand-written loops: train, evaluate, train_and_evaluate and continuous evaluation."""

import dataclasses
import sys
import time

import tensorflow as tf

from estimator_tpu.data import input_pipeline
from estimator_tpu.training import curves

PREFIX = "[estimator_tpu]"
SHOWN_METRICS = ("accuracy", "top_5_accuracy", "mean_per_class_accuracy", "macro_f1",
                 "eval_loss", "num_eval_examples")


def say(message):
  """Prints one progress line on stdout, marked so it stands out from TF's logs."""
  print(f"{PREFIX} {message}", file=sys.stdout, flush=True)


def current_step(model_dir):
  """The global step of the latest checkpoint in model_dir (0 when there is none)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    return 0
  return int(tf.train.load_variable(checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP))


def _duration(seconds):
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"


@dataclasses.dataclass
class Inputs:
  """The input_fns and sizes of one run."""
  train_input_fn: object
  eval_input_fn: object
  eval_steps: int
  num_eval_examples: int


def make_inputs(config, info):
  """Builds Inputs for a validated config and a resolved DataInfo."""
  d, t = config.data, config.train
  # image_size and transpose_input reach the input_fns through params, as they
  # reach model_fn: one route from the flags.
  train_fn = input_pipeline.make_input_fn(
      info.train_pattern, True, cache=d.cache, random_flip=d.random_flip,
      seed=t.seed or None)
  eval_fn = None
  steps = 0
  if info.num_eval_examples:
    eval_fn = input_pipeline.make_input_fn(
        info.eval_pattern, False, num_examples=info.num_eval_examples,
        global_batch_size=t.eval_batch_size, cache=d.cache)
    steps = input_pipeline.eval_steps(info.num_eval_examples, t.eval_batch_size)
  return Inputs(train_fn, eval_fn, steps, info.num_eval_examples)


def _format_metrics(results):
  parts = []
  for name in SHOWN_METRICS:
    if name in results:
      value = results[name]
      parts.append(f"{name}={int(value)}" if name == "num_eval_examples"
                   else f"{name}={value:.4f}")
  return " ".join(parts)


def evaluate(estimator, inputs, checkpoint_path=None):
  """One exact pass over the eval set; returns {metric: float}, including global_step."""
  results = estimator.evaluate(inputs.eval_input_fn, steps=inputs.eval_steps,
                               checkpoint_path=checkpoint_path)
  return {k: float(v) if k != "global_step" else int(v) for k, v in results.items()}


def record_evaluation(model_dir, results, train_steps, extra=None):
  """Appends to eval_history.jsonl, redraws learning_curves.png, prints the line."""
  record = dict(results, step=int(results["global_step"]), **(extra or {}))
  curves.append_history(model_dir, record)
  curves.write_learning_curves(model_dir)
  line = f"step {record['step']}/{train_steps} | {_format_metrics(results)}"
  if extra:
    if "train_images_per_sec" in extra:
      line += f" | {extra['train_images_per_sec']:.0f} img/s"
    if "elapsed_secs" in extra:
      line += f" | elapsed {_duration(extra['elapsed_secs'])}"
    if "eta_secs" in extra:
      line += f" | ETA {_duration(extra['eta_secs'])}"
  say(line)
  return record


def train_and_evaluate(estimator, config, inputs, evaluate_each=True):
  """Trains to the next checkpoint, evaluates over the whole eval set, repeats.

  Resumes from the latest checkpoint in model_dir: re-running the same
  command after a kill continues from that step, never from 0.

  Returns:
    The last evaluation's results (or {'global_step': step} with no eval).
  """
  t, r = config.train, config.runtime
  step = current_step(r.model_dir)
  if step:
    say(f"resuming from step {step} in {r.model_dir}")
  if step >= t.train_steps:
    say(f"step {step} already reaches --train_steps={t.train_steps}: nothing to train")
  start = time.time()
  start_step = step
  results = {"global_step": step}
  evaluating = evaluate_each and inputs.eval_input_fn
  while step < t.train_steps:
    # Without evaluation one train() call runs to the end: every call rebuilds the
    # graph (and on a TPU recompiles it). Checkpoints keep their cadence either way.
    target = min(step + t.steps_per_eval, t.train_steps) if evaluating else t.train_steps
    began = time.time()
    estimator.train(inputs.train_input_fn, max_steps=target)
    seconds = time.time() - began
    rate = (target - step) * t.train_batch_size / max(seconds, 1e-9)
    step = target
    if not evaluating:
      say(f"step {step}/{t.train_steps} | {rate:.0f} img/s")
      continue
    results = evaluate(estimator, inputs)
    elapsed = time.time() - start
    eta = elapsed / (step - start_step) * (t.train_steps - step)
    record_evaluation(r.model_dir, results, t.train_steps, {
        "train_images_per_sec": rate, "elapsed_secs": elapsed, "eta_secs": eta})
  return results


def continuous_evaluate(estimator, config, inputs):
  """Evaluates each new checkpoint in model_dir until one reaches --train_steps.

  Waits up to --eval_timeout_secs for a new checkpoint; a checkpoint deleted
  before it is read (the trainer keeps only the newest few) is skipped.
  """
  t, r = config.train, config.runtime
  results = {}
  for path in tf.train.checkpoints_iterator(r.model_dir, timeout=r.eval_timeout_secs):
    try:
      results = evaluate(estimator, inputs, checkpoint_path=path)
    except tf.errors.NotFoundError:
      say(f"checkpoint {path} was deleted before it could be evaluated; waiting for the next")
      continue
    record_evaluation(r.model_dir, results, t.train_steps)
    if results["global_step"] >= t.train_steps:
      break
  else:
    say(f"no new checkpoint in {r.model_dir} for {r.eval_timeout_secs}s; stopping")
  return results
