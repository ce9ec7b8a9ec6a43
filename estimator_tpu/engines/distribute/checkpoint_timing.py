"""When the distribute engine's train() checkpoints: CheckpointSaverHook's timing and listeners.

The Estimator's CheckpointSaverHook (or the program's, which takes its
place: hooks.take_over) saves the step a session starts from, then when
every_steps have passed since its last save or every_secs have (checked
after each session.run: here after each call of the training function,
whose loops end on the steps due), and at the end unless that step is
saved. Its listeners hear `begin`, `before_save` / `after_save` around each
save (an after_save that returns True stops training) and `end`.
"""

import time


class CheckpointTiming:
  """The saves of one train() call.

  Args:
    save: save(listeners) saves the global step's checkpoint, tells the
      listeners, and returns whether one of them asked to stop.
    listeners: the CheckpointSaverListeners of the call.
    every_steps: steps between saves.
    every_secs: seconds between saves (inf: none by time).
  """

  def __init__(self, save, listeners, every_steps, every_secs):
    self._save = save
    self._listeners = list(listeners)
    self._every_steps = every_steps
    self._every_secs = every_secs
    self._saved_at = None
    self._saved_time = None

  def begin(self):
    for listener in self._listeners:
      listener.begin()

  def start(self, step):
    """The save when the session starts (a listener's stop is not heard there, as in the hook)."""
    self._saved(step)
    self._save(self._listeners)

  def until_due(self, step):
    """Steps from global step `step` to the next save by steps."""
    return self._saved_at + self._every_steps - step

  def after_steps(self, step):
    """Saves at global step `step` if due; returns whether a listener asked to stop."""
    if (step - self._saved_at < self._every_steps
        and time.time() - self._saved_time < self._every_secs):
      return False
    self._saved(step)
    return self._save(self._listeners)

  def end(self, step):
    """The last save (unless step is saved already), then the listeners' end."""
    if step != self._saved_at:
      self._saved(step)
      self._save(self._listeners)
    for listener in self._listeners:
      listener.end(None, step)

  def _saved(self, step):
    self._saved_at, self._saved_time = step, time.time()
