"""SessionRunHooks at the distribute engine's loop edges, or refused by name.

The engine has no session: a hook's begin / after_create_session / end run
as the Estimator runs them, and before_run / after_run once per call of the
training function (iterations_per_loop steps, as on a TPU) or per evaluation
step, with `session` None and no fetched values. A hook whose before_run
asks for graph tensors (SessionRunArgs with fetches) cannot be served that
way: it is refused with its name and what to use instead, never run as if
it had worked.
"""

import dataclasses
import os

import tensorflow as tf

_CheckpointSaverHook = tf.compat.v1.train.CheckpointSaverHook
# Hooks whose work the engine does itself: the step rate is in its `global_step/sec`.
_DONE_BY_THE_ENGINE = (tf.compat.v1.train.StepCounterHook,)


@dataclasses.dataclass
class SavingPlan:
  """What CheckpointSaverHooks asked for, done by the engine's own saver."""
  every_steps: int = 0
  every_secs: float = 0
  listeners: list = dataclasses.field(default_factory=list)


def take_over(hooks, model_dir):
  """(hooks the runner runs, SavingPlan) — checkpoint saver hooks become the engine's saving.

  A CheckpointSaverHook (and its subclasses, e.g. tf.contrib.tpu's
  AsyncCheckpointSaverHook) saves the model into its checkpoint_dir every N
  steps or seconds and tells its listeners: the engine saves its own
  name-based checkpoints into model_dir at that cadence and tells the same
  listeners. One writing elsewhere is refused.
  """
  kept, plan = [], SavingPlan()
  for hook in hooks:
    if isinstance(hook, _DONE_BY_THE_ENGINE):
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
  return kept, plan


class UnsupportedHookError(ValueError):
  """A SessionRunHook needs a session or graph tensors; the message names it and the way out."""


def refusal(hook, what):
  return UnsupportedHookError(
      f"{type(hook).__name__} {what}; --engine=distribute runs no TF 1 session: write such "
      "values in the model_fn's host_call (tf.summary, every step on the host), or use "
      "--engine=estimator")


class HookRunner:
  """Runs hooks at a loop's edges; request_stop() from any after_run ends the loop."""

  def __init__(self, hooks, mode):
    self._hooks = list(hooks)
    self._mode = mode
    self._context = None

  def begin(self):
    with tf.Graph().as_default():
      for hook in self._hooks:
        hook.begin()

  def after_create_session(self):
    for hook in self._hooks:
      hook.after_create_session(None, None)

  def before_run(self):
    args = tf.compat.v1.train.SessionRunArgs(fetches=None)
    self._context = tf.compat.v1.train.SessionRunContext(args, None)
    for hook in self._hooks:
      asked = hook.before_run(self._context)
      if asked is not None and (asked.fetches is not None or asked.feed_dict):
        raise refusal(hook, "asks to fetch or feed graph tensors in before_run")

  def after_run(self, step):
    """Returns True when a hook asked to stop."""
    values = tf.compat.v1.train.SessionRunValues(results=None, options=None,
                                                 run_metadata=None)
    del step
    for hook in self._hooks:
      hook.after_run(self._context, values)
    return self._context.stop_requested

  def end(self):
    for hook in self._hooks:
      hook.end(None)
