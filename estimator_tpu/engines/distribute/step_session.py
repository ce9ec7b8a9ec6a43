"""What hooks get as `session` under the distribute engine: a session that runs what it can.

A hook's `after_create_session(session, coord)`, `end(session)` and
`run_context.session` get an `EngineSession`. Its `run(fetches)` serves:

- the global step: its value where the hooks are (in the after_run of step
  N, N + 1, as a session's read after that step's run gives);
- any other tensors and operations of the step's graph, outside the loop's
  replay or at its last step (where the engine's variables are where a
  session's would be): the part of the graph they need, run on the engine's
  variables (`pruning`), fed the next batch of the input when they need one,
  as TF 1 ran `session.run(loss)` on the next batch (a `LoggingTensorHook`
  at_end, a `FinalOpsHook`);
- anything else is refused with one line naming the fetch and the way out
  (fetch it in before_run with SessionRunArgs): `feed_dict`, run options
  and run metadata, and, inside a loop's replay, tensors whose values the
  engine has moved past.

A session over a TF 1 graph build of the model_fn (another part of the
engine) may be given as `twin`: what this session refuses goes to it.
"""

import tensorflow as tf

from estimator_tpu.engines.distribute import fetches as fetches_lib
from estimator_tpu.engines.distribute import pruning


class SessionRunRefused(ValueError):
  """A session.run the engine cannot do honestly; the message names it and the way out."""


class EngineSession:
  """The session hooks are handed; where it stands is set by the hook runner.

  Args:
    trace: the step_trace.StepTrace the hooks began in.
    variables: {name: variable} of the engine.
    next_batch: () -> the next batch's values in the order of trace.inputs,
      for fetches that need the step's input; None when there is no input.
    twin: None, or a session that serves what this one refuses.
  """

  def __init__(self, trace, variables, next_batch=None, twin=None):
    self._trace = trace
    self._variables = variables
    self._next_batch = next_batch
    self._twin = twin
    self._pruned = {}
    self.step = None  # the global step a read would give now
    self.where = None  # None: outside any run; else what the hooks are in ("after_run of step 5")
    self.state_current = True  # the engine's variables are where a session's would be

  @property
  def graph(self):
    return self._trace.graph

  @property
  def sess_str(self):
    return ""

  def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
    """session.run(fetches) as described above; values as TF 1 returns them (numpy)."""
    try:
      return self._run(fetches, feed_dict, options, run_metadata)
    except (SessionRunRefused, fetches_lib.FetchError):
      if self._twin is None:
        raise
      return self._twin.run(fetches, feed_dict=feed_dict, options=options,
                            run_metadata=run_metadata)

  def _run(self, fetches, feed_dict, options, run_metadata):
    if feed_dict:
      raise SessionRunRefused(
          f"session.run with a feed_dict ({', '.join(map(str, feed_dict))}): --engine=distribute "
          "feeds nothing; compute the value in the model_fn")
    if options is not None or run_metadata is not None:
      raise SessionRunRefused("session.run with run options or run metadata: --engine=distribute "
                              "runs tf.functions, which take neither")
    leaves = fetches_lib.resolve(fetches, self._trace.graph, self._variables)
    others = [leaf for leaf in tf.nest.flatten(leaves) if leaf.kind != fetches_lib.STEP]
    if not others:
      return fetches_lib.rebuild(leaves, lambda leaf: self._step_value())
    if not self.state_current:
      raise SessionRunRefused(
          f"session.run({_describe(others)}) in {self.where}, inside a loop of several steps "
          "run as one call: the engine's variables are already past that step; ask for it "
          "in before_run (SessionRunArgs) instead, or set iterations_per_loop=1")
    values = self._values(leaves, others)
    return fetches_lib.rebuild(leaves, values)

  def _step_value(self):
    if self.step is None:
      self.step = int(self._variables[tf.compat.v1.GraphKeys.GLOBAL_STEP].numpy())
    return tf.constant(self.step, tf.int64).numpy()

  def _values(self, leaves, others):
    """A function of the leaves: variables read, the rest from the pruned graph in one run."""
    elements = [leaf for leaf in others if leaf.kind != fetches_lib.VARIABLE]
    key = tuple((leaf.kind, leaf.key) for leaf in elements)
    by_key = {}
    if elements:
      if key not in self._pruned:
        try:
          self._pruned[key] = self._trace.pruned([self._element(leaf) for leaf in elements])
        except pruning.NeedsStepInputsError as error:
          raise SessionRunRefused(f"session.run({_describe(others)}): {error}") from None
      pruned = self._pruned[key]
      if pruned.uses_feeds and self._next_batch is None:
        raise SessionRunRefused(f"session.run({_describe(others)}) needs a batch of the input, "
                                "and there is none here")
      by_key = dict(zip(key, pruned(*self._next_batch()) if pruned.uses_feeds else pruned()))

    def value(leaf):
      if leaf.kind == fetches_lib.STEP:
        return self._step_value()
      if leaf.kind == fetches_lib.VARIABLE:
        return self._variables[leaf.key].read_value().numpy()
      return by_key[(leaf.kind, leaf.key)]

    return value

  def _element(self, leaf):
    if leaf.kind == fetches_lib.OP:
      return self._trace.graph.get_operation_by_name(leaf.key)
    return self._trace.graph.get_tensor_by_name(leaf.key)

  def close(self):
    """Nothing to close: the engine owns its resources."""


def _describe(leaves):
  names = [leaf.key for leaf in leaves]
  return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
