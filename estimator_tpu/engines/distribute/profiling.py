"""ProfilerHook's steps, profiled by the engine with tf.profiler.

`tf.compat.v1.train.ProfilerHook(save_steps=N | save_secs=S, output_dir)`
asks a session for FULL_TRACE run metadata every N steps (or S seconds)
and writes it as a Chrome trace, `timeline-<step>.json`. A tf.function
gives no step stats; the engine profiles the same steps with TensorFlow's
profiler instead: the step the hook's timer picks runs as a call of its own
under `tf.profiler.experimental`, which writes a TensorBoard profile in
place of the Chrome trace: `output_dir/timeline-<step>/plugins/profile/
<run>/<host>.xplane.pb`, a run TensorBoard's Profile tab shows when pointed
at output_dir. The first step is never profiled, as the hook's is not.
"""

import tensorflow as tf


class Profiling:
  """The ProfilerHooks of a train() call, as the engine's own profiling."""

  def __init__(self, hooks):
    self._hooks = list(hooks)
    self._first = None

  def due(self, step):
    """The ProfilerHooks whose timer picks the step after global step `step`."""
    if self._first is None:
      self._first = step
      for hook in self._hooks:
        hook._timer.update_last_triggered_step(step)  # pylint: disable=protected-access
      return []
    return [hook for hook in self._hooks
            if hook._timer.should_trigger_for_step(step + 1)]  # pylint: disable=protected-access

  def until_due(self, step):
    """Steps a loop from global step `step` may run before one of them is to be profiled."""
    cut = float("inf")
    for hook in self._hooks:
      timer = hook._timer  # pylint: disable=protected-access
      every, last = timer._every_steps, timer.last_triggered_step()  # pylint: disable=protected-access
      if every and last is not None:
        cut = min(cut, max(1, last + every - 1 - step))
    return cut

  def profile(self, hooks, step, run):
    """Runs run() (one step, from global step `step`) under the profiler of each due hook."""
    # The hook's timeline-<step>.json, as a directory holding the profile.
    directory = hooks[0]._output_file.format(step + 1)[:-len(".json")]  # pylint: disable=protected-access
    tf.profiler.experimental.start(directory)
    try:
      result = run()
    finally:
      tf.profiler.experimental.stop()
    for hook in hooks:
      hook._timer.update_last_triggered_step(step + 1)  # pylint: disable=protected-access
      tf.compat.v1.logging.info("Saving a profile of step %d into %s (plugins/profile)",
                                step + 1, directory)
    return result
