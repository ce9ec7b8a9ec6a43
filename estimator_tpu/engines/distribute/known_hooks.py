"""What the engine reads of hooks before they run: the tensors they hold, where loops must end.

- `candidates`: the graph elements a hook holds after begin() are what it
  can ask for (LoggingTensorHook's `_current_tensors`, NanTensorHook's loss,
  SummarySaverHook's summary op or its scaffold's, a program's hook's own
  attributes): the engine carries them from the first loop on, so a hook
  whose timer fires at step 100 finds its tensors carried then.
- `until_cut`: the steps a loop may run before a hook needs it to end: a
  StopAtStepHook's last step (training stops on it exactly, as in a
  session), and a StepCounterHook's every_n_steps (its steps/sec is then
  measured over whole loops, not over the replay of one).
"""

import tensorflow as tf

from estimator_tpu.engines.distribute import fetches as fetches_lib

_DEPTH = 3


def candidates(hooks, trace, variables):
  """{key: Leaf} of the tensors and variables the hooks hold in trace's graph."""
  found = {}
  for hook in hooks:
    for element in _elements(getattr(hook, "__dict__", {}), trace.graph, _DEPTH):
      try:
        leaf = fetches_lib.resolve(element, trace.graph, variables)
      except fetches_lib.FetchError:
        continue
      found.update(fetches_lib.flat_keys(leaf))
  return found


def _elements(value, graph, depth):
  """The tensors of graph (and the engine's variables) in value, a few containers deep."""
  if isinstance(value, tf.Tensor):
    if value.graph is graph:
      yield value
    return
  if isinstance(value, tf.Variable):
    yield value
    return
  if isinstance(value, tf.compat.v1.train.Scaffold):
    value = [value.summary_op]
  if depth == 0:
    return
  if isinstance(value, dict):
    value = list(value.values())
  if isinstance(value, (list, tuple, set)):
    for item in value:
      yield from _elements(item, graph, depth - 1)


def until_cut(hooks, step):
  """Steps from global step `step` until a loop must end for one of the hooks (inf: never)."""
  cut = float("inf")
  for hook in hooks:
    if isinstance(hook, tf.compat.v1.train.StopAtStepHook):
      last = hook._last_step  # pylint: disable=protected-access
      if last is not None and last > step:
        cut = min(cut, last - step)
    if isinstance(hook, tf.compat.v1.train.StepCounterHook):
      every = hook._timer._every_steps  # pylint: disable=protected-access
      if every:
        cut = min(cut, every - step % every)
  return cut
