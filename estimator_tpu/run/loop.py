"""The hand-written loops: train, evaluate, train_and_evaluate and continuous evaluation."""

import dataclasses
import os
import sys
import time

import tensorflow as tf

from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import strategies
from estimator_tpu.run import checkpoints
from estimator_tpu.run import curves
from estimator_tpu.run import determinism
from estimator_tpu.run import preemption

PREFIX = "[estimator_tpu]"
POLL_SECS = 1  # how often continuous evaluation looks for a new checkpoint
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
  """The input_fns and sizes of one run.

  train_input_fn_at(step) is the training input_fn of the train() call that
  starts at global step `step` (its seed input_pipeline.cycle_seed's);
  train_input_fn is the one of step 0 (what preflight checks).
  """
  train_input_fn_at: object
  eval_input_fn: object
  eval_steps: int
  num_eval_examples: int

  @property
  def train_input_fn(self):
    return self.train_input_fn_at(0)


def make_inputs(config, info):
  """Builds Inputs for a validated config and a resolved DataInfo."""
  d, t = config.data, config.train
  # image_size and transpose_input reach the input_fns through params, as they
  # reach model_fn: one route from the flags.

  def train_fn_at(step):
    return input_pipeline.make_input_fn(
        info.train_pattern, True, cache=d.cache, random_flip=d.random_flip,
        seed=input_pipeline.cycle_seed(t.seed or None, step), deterministic=t.deterministic)

  eval_fn = None
  steps = 0
  if info.num_eval_examples:
    eval_fn = input_pipeline.make_input_fn(
        info.eval_pattern, False, num_examples=info.num_eval_examples,
        global_batch_size=t.eval_batch_size, cache=d.cache)
    steps = input_pipeline.eval_steps(info.num_eval_examples, t.eval_batch_size)
  return Inputs(train_fn_at, eval_fn, steps, info.num_eval_examples)


def _format_metrics(results):
  parts = []
  for name in SHOWN_METRICS:
    if name in results:
      value = results[name]
      parts.append(f"{name}={int(value)}" if name == "num_eval_examples"
                   else f"{name}={value:.4f}")
  return " ".join(parts)


def evaluate(estimator, inputs, checkpoint_path=None, hooks=None):
  """One exact pass over the eval set; returns {metric: float}, including global_step.

  Returns None when a preemption.Watch's eval hook among hooks cut it short.
  """
  try:
    results = estimator.evaluate(inputs.eval_input_fn, steps=inputs.eval_steps,
                                 checkpoint_path=checkpoint_path, hooks=hooks)
  except preemption.EvaluationStopped:
    return None
  return {k: float(v) if k != "global_step" else int(v) for k, v in results.items()}


def record_evaluation(model_dir, results, train_steps, extra=None, write=True):
  """Appends to eval_history.jsonl, redraws learning_curves.png, prints the line.

  write=False (a worker of a cluster other than the chief): the line only.
  """
  record = dict(results, step=int(results["global_step"]), **(extra or {}))
  if write:
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


def stop_if_preempted(watch, model_dir):
  """Raises Preempted naming the checkpoint the run's stop saved (when a signal came).

  Only what the resume needs is done by then: the learning curves are drawn
  again at the next evaluation.
  """
  if not watch.requested:
    return
  watch.stopped()
  checkpoint = checkpoints.newest(model_dir)
  raise preemption.Preempted(watch.signal_name, checkpoints.restored_step(checkpoint),
                             checkpoint)


def resume_step(model_dir, fix=True):
  """The step of the newest checkpoint that restores.

  Args:
    model_dir: the run's directory.
    fix: set damaged newer checkpoints aside (only the process that writes
      checkpoints should: the chief of a multi-worker run).

  Raises:
    ConfigError: model_dir has checkpoints but none restores.
  """
  newest = checkpoints.newest_restorable(model_dir, fix=fix, report=say)
  step = checkpoints.restored_step(newest)
  if fix:
    # Evaluations of the steps given up belong with their checkpoints: kept aside.
    later = curves.set_aside_history_after(
        model_dir, step, os.path.join(model_dir, checkpoints.DAMAGED_DIR))
    if later:
      say(f"{later} evaluation(s) after step {step} moved to "
          f"{os.path.join(model_dir, checkpoints.DAMAGED_DIR, curves.HISTORY_FILE)}")
  return step


def _evaluation_missed(model_dir, step, config):
  """Whether a resumed run lacks the evaluation due at its step (the last run stopped in it)."""
  t = config.train
  due = step == t.train_steps or step % t.steps_per_eval == 0
  return step > 0 and due and step not in {h.get("step") for h in curves.read_history(model_dir)}


def train_and_evaluate(estimator, config, inputs, evaluate_each=True, watch=None, hooks=()):
  """Trains to the next checkpoint, evaluates over the whole eval set, repeats.

  Resumes from the newest checkpoint in model_dir that restores: re-running
  the same command after a kill continues from that step, never from 0.
  With --deterministic, runs under TensorFlow's op determinism
  (determinism.deterministic_ops).

  Args:
    estimator: what assemble.build() returns.
    config: the run's Config.
    inputs: make_inputs(config, info).
    evaluate_each: evaluate after every --steps_per_eval steps.
    watch: an active preemption.Watch; on its signal the run stops after the
      step in flight, with a checkpoint, by raising Preempted.
    hooks: more SessionRunHooks for every train() and evaluate() call.

  Returns:
    The last evaluation's results (or {'global_step': step} with no eval).

  Raises:
    preemption.Preempted: a watched signal arrived.
    ConfigError: model_dir has checkpoints but none restores.
  """
  with determinism.deterministic_ops(config.train.deterministic):
    return _train_and_evaluate(estimator, config, inputs, evaluate_each, watch, hooks)


def _train_and_evaluate(estimator, config, inputs, evaluate_each, watch, hooks):
  t, r = config.train, config.runtime
  watch = watch or preemption.Watch()
  train_hooks, eval_hooks = [watch.hook(), *hooks], [watch.eval_hook(), *hooks]
  chief = strategies.writes_checkpoints(r)  # the one that writes, in a cluster
  step = resume_step(r.model_dir, fix=chief)
  if step:
    say(f"resuming from step {step} in {r.model_dir}")
  if step >= t.train_steps:
    say(f"step {step} already reaches --train_steps={t.train_steps}: nothing to train")
  start = time.time()
  start_step = step
  results = {"global_step": step}
  evaluating = evaluate_each and inputs.eval_input_fn
  if evaluating and _evaluation_missed(r.model_dir, step, config):
    results = evaluate(estimator, inputs, hooks=eval_hooks)
    stop_if_preempted(watch, r.model_dir)
    record_evaluation(r.model_dir, results, t.train_steps, write=chief)
  while step < t.train_steps:
    stop_if_preempted(watch, r.model_dir)
    # Without evaluation one train() call runs to the end: every call rebuilds the
    # graph (and on a TPU recompiles it). Checkpoints keep their cadence either way.
    target = min(step + t.steps_per_eval, t.train_steps) if evaluating else t.train_steps
    began = time.time()
    estimator.train(inputs.train_input_fn_at(step), max_steps=target, hooks=train_hooks,
                    saving_listeners=[watch.listener()])
    stop_if_preempted(watch, r.model_dir)
    seconds = time.time() - began
    rate = (target - step) * t.train_batch_size / max(seconds, 1e-9)
    step = target
    if not evaluating:
      say(f"step {step}/{t.train_steps} | {rate:.0f} img/s")
      continue
    results = evaluate(estimator, inputs, hooks=eval_hooks)
    stop_if_preempted(watch, r.model_dir)  # a cut-short evaluation is not recorded
    elapsed = time.time() - start
    eta = elapsed / (step - start_step) * (t.train_steps - step)
    record_evaluation(r.model_dir, results, t.train_steps, {
        "train_images_per_sec": rate, "elapsed_secs": elapsed, "eta_secs": eta}, write=chief)
  return results


def continuous_evaluate(estimator, config, inputs, watch=None, hooks=()):
  """Evaluates each new checkpoint in model_dir until one reaches --train_steps.

  Waits up to --eval_timeout_secs for a new checkpoint. A checkpoint that does
  not read back whole is skipped with one line; one deleted before it is read
  (the trainer keeps only the newest few) is skipped too.

  Raises:
    preemption.Preempted: a watched signal arrived (the evaluation in flight
      is not recorded).
  """
  t, r = config.train, config.runtime
  watch = watch or preemption.Watch()
  hooks = [watch.eval_hook(), *hooks]
  results = {}
  waited_since = [time.time()]

  def stop_waiting():
    return watch.requested or time.time() - waited_since[0] >= r.eval_timeout_secs

  for path in tf.train.checkpoints_iterator(r.model_dir, timeout=POLL_SECS,
                                            timeout_fn=stop_waiting):
    reason = checkpoints.problem(path)
    if reason:
      say(f"skipping damaged checkpoint {path}: {reason}")
      waited_since[0] = time.time()
      continue
    try:
      results = evaluate(estimator, inputs, checkpoint_path=path, hooks=hooks)
    except tf.errors.NotFoundError:
      say(f"checkpoint {path} was deleted before it could be evaluated; waiting for the next")
      continue
    stop_if_preempted(watch, r.model_dir)
    record_evaluation(r.model_dir, results, t.train_steps)
    if results["global_step"] >= t.train_steps:
      return results
    waited_since[0] = time.time()
  stop_if_preempted(watch, r.model_dir)
  say(f"no new checkpoint in {r.model_dir} for {r.eval_timeout_secs}s; stopping")
  return results
