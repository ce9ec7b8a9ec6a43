"""SessionRunHooks at the distribute engine's loop edges, or refused by name.

The engine has no session: a hook's begin / after_create_session / end run
as the Estimator runs them, and before_run / after_run once per call of the
training function (iterations_per_loop steps, as on a TPU) or per evaluation
step, with `session` None and no fetched values. A hook whose before_run
asks for graph tensors (SessionRunArgs with fetches) cannot be served that
way: it is refused with its name and what to use instead, never run as if
it had worked.
"""

import tensorflow as tf


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
