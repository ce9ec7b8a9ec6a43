"""The workers of a multi-worker run on the distribute engine: who writes, and stops all agree on.

Under a MultiWorkerMirroredStrategy (TF_CONFIG's cluster) every worker runs
the same loop, and every collective op (a gradient all-reduce, a gather of
eval tensors) must be reached by all of them in the same order; a worker
that stops alone leaves the others waiting. So:

- the chief (task `chief`, else worker 0) writes the checkpoints, the
  summaries and the export; the others write nothing into model_dir: they
  run the same host_call (its variables and collectives are the chief's
  too), but its summary writers write into a temporary directory, as does
  an export of theirs, removed when the process exits;
- a checkpoint is saved by all together: each worker reaches the save, the
  chief writes, and no worker goes on before the file is there, so every
  worker resumes from the chief's latest checkpoint;
- each worker's input is its own: an input_fn that shards by
  params['context'] (TPUEstimator's PER_HOST_V2 contract: which host of how
  many) does so itself; one that never reads the context gives every worker
  the same batches, so each keeps every n-th (n workers), and a step's
  global batch is the one-device run's;
- a stop is agreed at the loop's edges, where all workers are at the same
  step: a hook's request_stop() or a preemption signal (SIGTERM/SIGINT)
  caught by any worker's preemption.Watch stops every worker there, and
  each worker's watch then acts as if the signal had come to it, so all
  save the same step and exit 75.

TensorFlow's PreemptionCheckpointHandler agrees on a step through the
coordination service too, but it saves through an object-based
tf.train.Checkpoint and its own directory, and replaces the process's
SIGTERM handler with its own exit; the engine's checkpoints are the
estimator's name-based `model.ckpt-N`, so the agreement here is one small
all-reduce per loop (iterations_per_loop steps) among the workers.
On one worker (any other strategy) nothing here does anything.
"""

import atexit
import copy
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from estimator_tpu.run import preemption

_SIGNAL_NAMES = tuple(s.name for s in preemption.SIGNALS)


def watching_context(params):
  """(params whose 'context' notes the input_fn's reads of it, reads: a list of names read)."""
  context = params.get("context")
  reads = []
  if context is None:
    return params, reads
  base = type(context)

  class Watched(base):
    def __getattribute__(self, name):
      reads.append(name)
      return base.__getattribute__(self, name)

  Watched.__name__ = Watched.__qualname__ = base.__name__
  watched = copy.copy(context)
  watched.__class__ = Watched
  if isinstance(params, dict):
    return dict(params, context=watched), reads
  params = copy.copy(params)  # an HParams: TPUEstimator's params may be one
  params.context = watched
  return params, reads


def shard_unless_read(dataset, read, input_context):
  """An input pipeline's batches, every n-th of them when the input_fn ignored its context.

  Args:
    dataset: what the input_fn returned.
    read: whether the input_fn read params['context'] (watching_context).
    input_context: the tf.distribute.InputContext of this input pipeline.
  """
  pipelines = input_context.num_input_pipelines if input_context else 1
  if read or pipelines <= 1 or not isinstance(dataset, tf.data.Dataset):
    return dataset
  return dataset.shard(pipelines, input_context.input_pipeline_id)


class Workers:
  """The workers of `strategy`: one, or a MultiWorkerMirroredStrategy's cluster."""

  def __init__(self, strategy):
    self._strategy = strategy
    in_cluster = getattr(strategy.extended, "_in_multi_worker_mode", None)
    self.many = bool(in_cluster and in_cluster())
    self.is_chief = bool(strategy.extended.should_checkpoint) or not self.many
    self._all_sum = None
    self._scratch = None

  def sum(self, values):
    """values (a list of ints) summed over every replica of every worker; as given on one worker."""
    if not self.many:
      return np.asarray(values, np.int64)
    if self._all_sum is None:
      strategy = self._strategy

      def all_sum(x):
        per_replica = strategy.run(lambda: tf.identity(x))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

      self._all_sum = tf.function(all_sum, autograph=False)
    with self._strategy.scope():
      return self._all_sum(tf.constant(values, tf.int64)).numpy()

  def barrier(self):
    """Returns once every worker has reached a barrier (the same one)."""
    if self.many:
      self.sum([0])

  def agree_to_stop(self, stop, hooks):
    """Whether any worker stops here: its hooks asked to (`stop`) or its watch holds a signal.

    A signal agreed on is handed to every worker's preemption.Watch among
    `hooks` (Watch.release), which then stops as if the signal came to it.
    Called by every worker at the same point of its loop.

    Args:
      stop: whether this worker's hooks asked to stop.
      hooks: the SessionRunHooks of this train() or evaluate() call.

    Returns:
      True when some worker stops: all do.
    """
    if not self.many:
      return stop
    watches = preemption.watches_of(hooks)
    held = {watch.held for watch in watches}
    totals = self.sum([int(bool(stop))] + [int(name in held) for name in _SIGNAL_NAMES])
    agreed = [name for name, total in zip(_SIGNAL_NAMES, totals[1:]) if total > 0]
    if agreed:
      for watch in watches:
        watch.release(agreed[0])
    return bool(totals.any())

  def share_chiefs_values(self, variables):
    """Every worker's copies of variables ({name: variable}) take the chief's values.

    A variable the strategy makes starts from the chief's initial value on
    every worker; values assigned afterwards by each worker on its own (a
    fresh start's TF 1 initial values) are made one here, by one all-reduce
    in which only the chief's first replica gives its values.
    """
    if not self.many:
      return
    names = sorted(name for name, v in variables.items() if v.dtype.is_floating)
    strategy = self._strategy
    local = [strategy.experimental_local_results(variables[n])[0].read_value() for n in names]

    def replica():
      first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
      given = [tf.where(first, value, tf.zeros_like(value)) for value in local]
      return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, given)

    with strategy.scope():
      shared = strategy.experimental_local_results(
          tf.function(lambda: strategy.run(replica), autograph=False)())[0]
      for name, value in zip(names, shared):
        variables[name].assign(value)

  def scratch_dir(self, name):
    """A temporary directory of this (non-chief) worker, removed when the process exits."""
    if self._scratch is None:
      self._scratch = tempfile.mkdtemp(prefix="estimator_tpu_worker_")
      atexit.register(shutil.rmtree, self._scratch, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{name}_", dir=self._scratch)
