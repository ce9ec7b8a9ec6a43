"""SessionRunHooks on the distribute engine, run as a MonitoredSession runs them.

Each hook gets `begin()` with the step's graph as the default graph (the
first replica's trace of the model_fn: step_trace.py), then
`after_create_session(session, coord)`, `before_run` / `after_run` for every
step with `run_values.results` holding exactly what it asked for at that
step, and `end(session)`; `session` is a step_session.EngineSession.

Training runs several steps in one call of a compiled function
(iterations_per_loop, as TPUEstimator loops on the TPU). The step carries
out, for every step of the loop, the tensors hooks may ask for, and the
runner replays each step's before_run / after_run in step order once the
call returns. The engine learns what to carry from the hooks themselves:
the graph tensors each hook holds after begin() (LoggingTensorHook's
tensors, NanTensorHook's loss, SummarySaverHook's summary op, a program's
hook's own), and each loop's first before_run, called before the loop runs
(a new request there makes the engine trace the step again, carrying it).
A later step asking for something the loop did not carry cannot be served
from a loop that has run: that is refused with one line, never answered
with less than was asked. What differs from a session, and is documented
in docs/TPU_AND_GPUS.md: a `request_stop()` ends training at the end of its
loop (the hooks see no step after it); hooks' timers see the replay's clock.

`take_over` turns the hooks whose work the engine does itself into its
own: CheckpointSaverHooks become its saving, ProfilerHooks its profiling.
A hook that feeds (`feed_dict`, FeedFnHook) or asks for run options is
refused by name.
"""

import contextlib
import dataclasses
import logging
import os
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import fetches as fetches_lib
from estimator_tpu.engines.distribute import known_hooks
from estimator_tpu.engines.distribute import profiling
from estimator_tpu.engines.distribute import step_session
from estimator_tpu.engines.distribute import step_trace

_CheckpointSaverHook = tf.compat.v1.train.CheckpointSaverHook


@dataclasses.dataclass
class SavingPlan:
  """What CheckpointSaverHooks and ProfilerHooks asked for, done by the engine itself."""
  every_steps: int = 0
  every_secs: float = 0
  listeners: list = dataclasses.field(default_factory=list)
  profiling: object = None


def take_over(hooks, model_dir):
  """(hooks the runner runs, SavingPlan) — checkpoint savers and profilers become the engine's.

  A CheckpointSaverHook (and its subclasses, e.g. tf.contrib.tpu's
  AsyncCheckpointSaverHook) saves the model into its checkpoint_dir every N
  steps or seconds and tells its listeners: the engine saves its own
  name-based checkpoints into model_dir at that cadence and tells the same
  listeners. One writing elsewhere is refused. ProfilerHooks: profiling.py.
  """
  kept, plan, profilers = [], SavingPlan(), []
  for hook in hooks:
    if isinstance(hook, tf.compat.v1.train.ProfilerHook):
      profilers.append(hook)
      continue
    if not isinstance(hook, _CheckpointSaverHook):
      kept.append(hook)
      continue
    directory = getattr(hook, "_checkpoint_dir", model_dir)
    if os.path.normpath(str(directory)) != os.path.normpath(str(model_dir)):
      raise refusal(hook, f"saves into {directory}, not the model_dir {model_dir}")
    timer = hook._timer  # pylint: disable=protected-access
    steps, secs = timer._every_steps, timer._every_secs  # pylint: disable=protected-access
    if steps:
      plan.every_steps = min(plan.every_steps or steps, steps)
    if secs:
      plan.every_secs = min(plan.every_secs or secs, secs)
    plan.listeners.extend(hook._listeners)  # pylint: disable=protected-access
  plan.profiling = profiling.Profiling(profilers) if profilers else None
  return kept, plan


class UnsupportedHookError(ValueError):
  """A SessionRunHook asks what the engine cannot give; the message names it and the way out."""


def refusal(hook, what):
  return UnsupportedHookError(
      f"{type(hook).__name__} {what}; --engine=distribute runs no TF 1 session: compute such "
      "values in the model_fn (fetch them with SessionRunArgs, or write them in a host_call), "
      "or use --engine=estimator")


def model_fn_hooks(spec, mode):
  """The hooks the model_fn returned for mode (training_chief_hooks too: the engine is chief)."""
  if mode == stacks.ModeKeys.TRAIN:
    return [*getattr(spec, "training_chief_hooks", ()), *getattr(spec, "training_hooks", ())]
  if mode == stacks.ModeKeys.EVAL:
    return list(getattr(spec, "evaluation_hooks", ()) or ())
  return list(getattr(spec, "prediction_hooks", ()) or ())


def in_estimator_order(mode, given, spec):
  """The hooks of one call, in the order the Estimator runs them (estimator.py).

  Training: the model_fn's training_chief_hooks (the chief's come first),
  the hooks given to train(), the Estimator's NanTensorHook on the loss
  (a NaN loss stops training with NanLossDuringTrainingError), then the
  model_fn's training_hooks. Evaluation and prediction: the hooks given,
  then the model_fn's.
  """
  if mode != stacks.ModeKeys.TRAIN:
    return [*given, *model_fn_hooks(spec, mode)]
  return [*getattr(spec, "training_chief_hooks", ()), *given,
          tf.compat.v1.train.NanTensorHook(spec.loss), *getattr(spec, "training_hooks", ())]


def runner_for(mode, hooks, trace, store, strategy, iterator, model_dir, original_fetches,
               twin=None):
  """(HookRunner of one train/evaluate/predict call, SavingPlan of its savers and profilers).

  Args:
    mode: the call's ModeKeys.
    hooks: the hooks given to the call.
    trace: the step_trace.StepTrace of the call's step function.
    store: the engine's VariableStore.
    strategy: its strategy.
    iterator: the call's distributed iterator (the first replica's next batch
      feeds a session.run that needs one).
    model_dir: where the engine saves.
    original_fetches: what the Estimator's own session.run fetches in mode.
    twin: None, or a TF 1 session over a graph build of the model_fn, which
      serves the session.run calls the engine refuses (step_session.py).

  Raises:
    UnsupportedHookError: a CheckpointSaverHook or ProfilerHook outside training.
  """
  hooks, plan = take_over(in_estimator_order(mode, hooks, trace.spec), model_dir)
  if mode != stacks.ModeKeys.TRAIN and (plan.listeners or plan.profiling or plan.every_steps
                                        or plan.every_secs):
    raise UnsupportedHookError(
        f"a CheckpointSaverHook or a ProfilerHook is among the {mode} hooks: "
        "--engine=distribute saves and profiles in training only, between its loops")

  def next_batch():
    element = next(iterator)
    return [strategy.experimental_local_results(t)[0] for t in tf.nest.flatten(element)]

  runner = HookRunner(hooks, trace, store.variables, advances=mode == stacks.ModeKeys.TRAIN,
                      original_fetches=original_fetches, next_batch=next_batch,
                      scope=store.scope, twin=twin)
  return runner, plan


class _GraphExportFilter(logging.Filter):
  """Drops TF's warnings about collections of the engine's variables it cannot serialize.

  A hook's FileWriter writes the step's graph (as the Estimator's writes
  its graph); the engine's variables, made outside the graph, are in its
  collections and are left out of the written meta graph.
  """

  def filter(self, record):
    return not record.getMessage().startswith("Issue encountered when serializing")


@contextlib.contextmanager
def _quiet_graph_export():
  """Hooks' begin() in the step's graph, without TF's complaints about the engine's own parts."""
  logger, quiet = tf.get_logger(), _GraphExportFilter()
  logger.addFilter(quiet)
  try:
    with warnings.catch_warnings():
      # TF 1 summary ops made in a function's graph (the Scaffold's summary op).
      warnings.filterwarnings("ignore", message="Cannot activate TF2 compatibility support")
      yield
  finally:
    logger.removeFilter(quiet)


@dataclasses.dataclass
class _Request:
  """What one hook asked for at one step."""
  hook: object
  leaves: object = None  # a structure of fetches.Leaf, or None


class HookRunner:
  """Runs hooks around the engine's calls, each step's before_run / after_run in step order.

  Args:
    hooks: SessionRunHooks, in the order the estimator runs them.
    trace: the step_trace.StepTrace whose graph the hooks begin in.
    variables: {name: variable} of the engine.
    advances: True in training (each step adds 1 to the global step).
    original_fetches: what the estimator's own session.run fetches
      (`run_context.original_args`).
    next_batch: for session.run fetches that need a batch (see EngineSession).
    scope: () -> the context the model_fn is called in (the engine's variable
      store), where hooks begin.
    twin: passed to EngineSession.
  """

  def __init__(self, hooks, trace, variables, advances, original_fetches=None,
               next_batch=None, scope=None, twin=None):
    self.hooks = list(hooks)
    for hook in self.hooks:
      if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
        raise TypeError(f"Hooks must be a SessionRunHook, given: {hook}")
    self._trace = trace
    self._variables = variables
    self._scope = scope or contextlib.nullcontext
    self._advances = advances
    self._original = tf.compat.v1.train.SessionRunArgs(original_fetches)
    self.session = step_session.EngineSession(trace, variables, next_batch, twin)
    self._coord = tf.compat.v1.train.Coordinator()
    self.carried = {}  # {key: Leaf} every step of a loop carries out
    self._resolved = {}  # what each hook's fetches resolved to

  def begin(self):
    self._trace.seal()
    with self._trace.as_default(self._scope), _quiet_graph_export():
      for hook in self.hooks:
        hook.begin()
      step_trace.finalize_summary_op(self._trace, training=self._advances)
      self.carried.update(known_hooks.candidates(self.hooks, self._trace, self._variables))

  def after_create_session(self, step):
    self._at(step, "after_create_session")
    for hook in self.hooks:
      hook.after_create_session(self.session, self._coord)

  def until_cut(self, step):
    """Steps from step until a loop must end for the hooks (a StopAtStepHook's last step, ...)."""
    return known_hooks.until_cut(self.hooks, step)

  def run(self, step, count, run_fn):
    """Runs count steps from global step `step` through run_fn, the hooks around each.

    Args:
      step: the global step before the first of them.
      count: how many steps run_fn runs in its one call.
      run_fn: run_fn(leaves) runs the steps carrying {key: Leaf} leaves and
        returns {key: numpy array [count, ...]}.

    Returns:
      True when a hook asked to stop (request_stop, or its coordinator).

    Raises:
      UnsupportedHookError: a hook feeds, asks for run options, or asked at a
        step after a loop's first for a tensor the loop did not carry.
    """
    context, requests = self._before_run(step, current=True)  # before the loop runs
    for request in requests:
      self.carried.update(fetches_lib.flat_keys(request.leaves))
    results = run_fn(dict(self.carried))
    for index in range(count):
      if index:
        context, requests = self._before_run(step + index, current=False)
        self._check_carried(requests, step, step + index, count)
      self._after_run(context, requests, step + index, results, index, index == count - 1)
      if context.stop_requested or self._coord.should_stop():
        return True
    return False

  def end(self, step):
    self._at(step, "end")
    for hook in self.hooks:
      hook.end(self.session)

  def _at(self, step, where, current=True):
    self.session.step = step
    self.session.where = where
    self.session.state_current = current

  def _before_run(self, step, current):
    self._at(step, f"before_run of step {step}", current=current)
    context = tf.compat.v1.train.SessionRunContext(self._original, self.session)
    requests = []
    for hook in self.hooks:
      asked = hook.before_run(context)
      requests.append(_Request(hook, self._resolve(hook, asked)))
    return context, requests

  def _resolve(self, hook, asked):
    if asked is None:
      return None
    if asked.feed_dict:
      raise refusal(hook, "feeds the graph (a feed_dict in before_run)")
    if asked.options is not None and asked.options.ByteSize():
      raise refusal(hook, f"asks for run options ({str(asked.options).strip()}); a "
                    "tf.compat.v1.train.ProfilerHook is done by the engine's profiler")
    if asked.fetches is None:
      return None
    # A hook asks for the same things step after step: resolved once per set of elements.
    key = (id(hook), repr(tf.nest.map_structure(lambda _: None, asked.fetches)),
           tuple(x if isinstance(x, str) else id(x) for x in tf.nest.flatten(asked.fetches)))
    if key not in self._resolved:
      try:
        self._resolved[key] = fetches_lib.resolve(asked.fetches, self._trace.graph,
                                                  self._variables)
      except fetches_lib.FetchError as error:
        raise refusal(hook, f"asks to fetch something the engine cannot give: {error}") from None
    return self._resolved[key]

  def _check_carried(self, requests, first, step, count):
    for request in requests:
      for key in fetches_lib.flat_keys(request.leaves):
        if key not in self.carried:
          raise refusal(
              request.hook,
              f"asked at step {step} for {key}, which no hook asked for at step {first}, the "
              f"first of the {count} steps run as one call (iterations_per_loop): they ran "
              "without carrying it. A hook that asks for new tensors after the first step "
              "needs iterations_per_loop=1")

  def _after_run(self, context, requests, step, results, index, last):
    done = step + 1 if self._advances else step
    self._at(done, f"after_run of step {step}", current=last)

    def value(leaf):
      if leaf.kind == fetches_lib.STEP:
        return np.int64(step)
      return results[leaf.key][index]

    for request in requests:
      values = tf.compat.v1.train.SessionRunValues(
          results=None if request.leaves is None else fetches_lib.rebuild(request.leaves, value),
          options=config_pb2.RunOptions(), run_metadata=config_pb2.RunMetadata())
      request.hook.after_run(context, values)
