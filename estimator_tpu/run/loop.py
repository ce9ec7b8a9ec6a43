"""The hand-written loops: train, evaluate, train_and_evaluate and continuous evaluation."""

import dataclasses
import os
import sys
import time

import tensorflow as tf

from estimator_tpu import progress
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import strategies
from estimator_tpu.model import user_model_fn
from estimator_tpu.run import checkpoints
from estimator_tpu.run import curves
from estimator_tpu.run import determinism
from estimator_tpu.run import preemption
from estimator_tpu.run import train_progress

PREFIX = "[estimator_tpu]"
# Continuous evaluation looks for a new checkpoint once a second, sleeping in between:
# checkpoints_iterator waits in slices of WAIT_SLICE_SECS (it sleeps 1 s while that
# leaves time in the slice: a 1 s slice would never sleep), then asks whether to stop.
WAIT_SLICE_SECS = 2
_COUNTS = ("global_step", user_model_fn.COUNT_METRIC)
SHOWN_METRICS = ("accuracy", "top_5_accuracy", "mean_per_class_accuracy", "macro_f1",
                 "eval_loss", "num_eval_examples")


def say(message):
  """Prints one line on stdout, marked so it stands out from TF's logs (above a live line)."""
  progress.write(f"{PREFIX} {message}", file=sys.stdout)


def current_step(model_dir):
  """The global step of the latest checkpoint in model_dir (0 when there is none)."""
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    return 0
  return int(tf.train.load_variable(checkpoint, tf.compat.v1.GraphKeys.GLOBAL_STEP))


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
  return {k: int(v) if k in _COUNTS else float(v) for k, v in results.items()}


def record_evaluation(model_dir, results, train_steps, extra=None, write=True):
  """Appends to eval_history.jsonl, redraws learning_curves.png, prints the line.

  write=False (a worker of a cluster other than the chief): the line only.
  """
  record = dict(results, step=int(results["global_step"]), **(extra or {}))
  if "eval_loss" in record:
    # The Estimator's `loss` (the mean of the batches' losses) repeats eval_loss,
    # which is exact over the eval set; a model_fn without eval_loss keeps it.
    record.pop("loss", None)
  if write:
    curves.append_history(model_dir, record)
    curves.write_learning_curves(model_dir)
  line = f"step {record['step']}/{train_steps} | {_format_metrics(results)}"
  if extra:
    if "train_images_per_sec" in extra:
      line += f" | {extra['train_images_per_sec']:.0f} img/s"
    if "elapsed_secs" in extra:
      line += f" | elapsed {progress.duration(extra['elapsed_secs'])}"
    if "eta_secs" in extra:
      line += f" | ETA {progress.duration(extra['eta_secs'])}"
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
  shown = train_progress.TrainProgress(t.train_steps, t.train_batch_size, step, say)
  try:
    return _train_loop(estimator, config, inputs, evaluate_each, watch, step,
                       [*train_hooks, shown.hook()], eval_hooks, shown)
  finally:
    shown.close()


def _train_loop(estimator, config, inputs, evaluate_each, watch, step, train_hooks, eval_hooks,
                shown):
  t, r = config.train, config.runtime
  chief = strategies.writes_checkpoints(r)  # the one that writes, in a cluster
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
    shown.update(step)
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
  waiting = _Waiting(r.model_dir, r.eval_timeout_secs, watch)
  for path in tf.train.checkpoints_iterator(r.model_dir, timeout=WAIT_SLICE_SECS,
                                            timeout_fn=waiting.should_stop):
    reason = checkpoints.problem(path)
    if reason:
      say(f"skipping damaged checkpoint {path}: {reason}")
      waiting.restart()
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
    waiting.restart(after_step=results["global_step"])
  stop_if_preempted(watch, r.model_dir)
  say(f"no new checkpoint in {r.model_dir} for {r.eval_timeout_secs}s; stopping")
  return results


class _Waiting:
  """The evaluator's wait for a new checkpoint: said once, ended by a signal or the timeout."""

  def __init__(self, model_dir, timeout_secs, watch):
    self._model_dir, self._timeout_secs, self._watch = model_dir, timeout_secs, watch
    self._after_step = None
    self.restart()

  def restart(self, after_step=None):
    """A new wait begins (after an evaluation of after_step, or a skipped checkpoint)."""
    self._since = time.time()
    self._said = False
    if after_step is not None:
      self._after_step = after_step

  def should_stop(self):
    """checkpoints_iterator's timeout_fn, called after each slice of waiting in vain."""
    if not self._said:
      which = ("a checkpoint" if self._after_step is None
               else f"a checkpoint after step {self._after_step}")
      say(f"waiting for {which} in {self._model_dir} (stops after "
          f"--eval_timeout_secs={self._timeout_secs} without one)")
      self._said = True
    return self._watch.requested or time.time() - self._since >= self._timeout_secs
