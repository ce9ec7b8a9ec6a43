"""--host_loop: off TPU, --iterations_per_loop training steps per session.run, as on a TPU.

On a TPU, TPUEstimator runs iterations_per_loop steps per session.run (a
while loop over the infeed); on CPU and GPU it runs one step per
session.run (the default here too), and every run pays the host's round trip: the hooks' Python,
the executor's start, and the threads idling while the step's last ops drain
(about a tenth of a 30 ms step of the flowers CNN on 2 cores;
benchmarks/bench_train.py). `host_loop.TPUEstimator` runs the same loop on the
host: the model_fn is traced once inside a tf.while_loop whose body takes
the next batch from the input iterator, runs the training step and its
host_call (the train/* summaries, still written for every step the
host_call asks for), and TPUEstimator's own `iterations_per_loop` variable,
set by its TPU stop hook, bounds the loop so that train(steps=...) and
max_steps end on the exact step. The hooks see such a run as they see a
TPU's: the global step advances by up to iterations_per_loop per
session.run, and checkpoints, logging and a preemption stop happen between
loops (so keep a loop well under the 30 s a preempted VM allows). It is
opt-in, like Keras' steps_per_execution: the gain is the per-step overhead
of small steps, and the price is what follows.

What the model_fn must allow, as on a TPU: variables created with callable
initializers (Keras layers, tf.compat.v1.get_variable), summaries written
with tf.summary in its host_call (tf.compat.v1.summary ops in it are
rejected when the graph is built, as are writers it would create inside the
loop: tf.summary.create_file_writer and our tf.contrib.summary one create
theirs outside), and training_hooks that fetch nothing
the model_fn creates. Without --host_loop (or with --iterations_per_loop=1)
training runs one step per session.run.
"""

import tensorflow as tf
from tensorflow.python.ops import summary_ops_v2
from tensorflow.python.util import function_utils
from tensorflow_estimator.python.estimator.tpu import tpu_estimator as tpu_estimator_impl

from estimator_tpu import stacks


def loop_iterations(run_config, use_tpu):
  """Steps per session.run of a host loop; 1 on a TPU (the TPU loops itself) or without one."""
  iterations = run_config.tpu_config.iterations_per_loop
  if use_tpu or not isinstance(iterations, int):  # '300s': TPU-only, timed loops
    return 1
  return iterations


def steps_per_run(estimator):
  """Off TPU, training steps per session.run of estimator.train() when its steps divide by it."""
  return getattr(estimator, "host_loop_iterations", 1)


class TPUEstimator(stacks.tpu.TPUEstimator):
  """TPUEstimator that, off TPU with host_loop=True (--host_loop), trains
  iterations_per_loop steps per session.run.

  `host_loop_iterations` is that number (1: one step per session.run, the
  default, or a TPU).
  The class keeps TPUEstimator's name: Estimator refuses subclasses that
  override its members, except by that name (TPUEstimator's own override of
  _convert_train_steps_to_hooks, for its TPU loop, is the one extended here).
  """

  def __init__(self, model_fn, config, use_tpu=True, host_loop=False, **kwargs):
    self.host_loop_iterations = loop_iterations(config, use_tpu) if host_loop else 1
    if self.host_loop_iterations > 1:
      model_fn = with_host_loop(model_fn)
    super().__init__(model_fn=model_fn, config=config, use_tpu=use_tpu, **kwargs)

  def _convert_train_steps_to_hooks(self, steps, max_steps):
    # TPUEstimator's TPU stop hook: it sets the loop's length before each run so
    # the last loop ends on the last step (and stops the run there).
    if self.host_loop_iterations == 1 or (steps is None and max_steps is None):
      return super()._convert_train_steps_to_hooks(steps, max_steps)
    return [tpu_estimator_impl._TPUStopAtStepHook(  # pylint: disable=protected-access
        self._iterations_per_training_loop, steps, max_steps)]


class SummaryWriterHook(tf.compat.v1.train.SessionRunHook):
  """Starts the graph's tf.summary writers with the session and flushes them at the end.

  What TPUEstimator's host_call hook does off TPU, for host_calls that run
  inside the loop.
  """

  def begin(self):
    self._init_ops = summary_ops_v2.summary_writer_initializer_op()
    self._flush_ops = [tf.raw_ops.FlushSummaryWriter(writer=op.inputs[0])
                       for op in self._init_ops]

  def after_create_session(self, session, coord):
    del coord
    session.run(self._init_ops)

  def end(self, session):
    session.run(self._flush_ops)


def _batch_source(features, labels):
  """A function returning the next (features, labels) of their input iterator, or None.

  None unless every tensor of features and labels is an output of one
  IteratorGetNext op (an input_fn that returned a tf.data.Dataset).
  """
  tensors = [t for t in tf.nest.flatten((features, labels)) if t is not None]
  if not tensors or not all(isinstance(t, tf.Tensor) for t in tensors):
    return None
  get_next = tensors[0].op
  if get_next.type != "IteratorGetNext" or any(t.op is not get_next for t in tensors):
    return None

  def next_batch():
    outputs = tf.raw_ops.IteratorGetNext(
        iterator=get_next.inputs[0], output_types=get_next.get_attr("output_types"),
        output_shapes=get_next.get_attr("output_shapes"))
    return tf.nest.map_structure(
        lambda t: None if t is None else outputs[t.value_index], (features, labels))

  return next_batch


def _host_call_ops(host_call):
  """Runs a TPUEstimatorSpec host_call (fn, tensors) here; returns what it returned, flat."""
  if host_call is None:
    return []
  fn, tensors = host_call
  result = fn(**tensors) if isinstance(tensors, dict) else fn(*tensors)
  return [x for x in tf.nest.flatten(result) if x is not None]


def _v1_summaries():
  return {s.ref() for s in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)}


def _check_no_v1_summaries(before):
  added = sorted(s.deref().op.name for s in _v1_summaries() - before)
  if added:
    raise ValueError(
        f"the model_fn created tf.compat.v1.summary ops ({', '.join(added)}); with "
        "--host_loop it runs inside a loop of that many steps per "
        "session.run, as on a TPU, where they cannot be fetched: write them with "
        "tf.summary in a host_call, or leave out --host_loop")


def _check_writers_outside(graph):
  inside = [op.name for op in summary_ops_v2.summary_writer_initializer_op()
            if op.graph is not graph or op._control_flow_context is not None]  # pylint: disable=protected-access
  if inside:
    raise ValueError(
        f"the host_call created a summary writer inside the loop ({', '.join(inside)}); "
        "with --host_loop it runs inside a loop of that many steps "
        "per session.run, where the writer could not be started: create it with "
        "tf.summary.create_file_writer, or leave out --host_loop")


def _training_loop(call, next_batch, default_iterations):
  """(last step's spec, its loss as a loop output, the loop op)."""
  # TPUEstimator's variable, set by _TPUStopAtStepHook before each run; 0
  # (never set) when train() was given neither steps nor max_steps.
  iterations = tpu_estimator_impl._create_or_get_iterations_per_loop()  # pylint: disable=protected-access
  iterations = tf.where(iterations > 0, iterations, default_iterations)
  specs = []

  def body(i, loss):
    del loss
    spec = call(*next_batch())
    specs.append(spec)
    with tf.control_dependencies([spec.train_op, *_host_call_ops(spec.host_call)]):
      return i + 1, tf.cast(spec.loss, tf.float32)

  before = _v1_summaries()
  _, loss = tf.compat.v1.while_loop(
      lambda i, loss: i < iterations, body, [tf.constant(0), tf.constant(0.0)],
      parallel_iterations=1, back_prop=False, name="host_loop")
  _check_no_v1_summaries(before)
  _check_writers_outside(tf.compat.v1.get_default_graph())
  return specs[0], loss


def with_host_loop(model_fn):
  """model_fn' that, in training off TPU, runs model_fn in a loop of iterations_per_loop steps.

  Elsewhere (evaluation, prediction, a TPU, an input_fn that returned
  tensors rather than a dataset) it calls model_fn as it is.
  """
  named = set(function_utils.fn_args(model_fn))

  def looping_model_fn(features, labels, mode, params, config):
    given = {"mode": mode, "params": params, "config": config}
    kwargs = {name: value for name, value in given.items() if name in named}

    def call(features, labels):
      if "labels" in named:
        return model_fn(features, labels=labels, **kwargs)
      return model_fn(features, **kwargs)

    iterations = loop_iterations(config, params.get("use_tpu"))
    next_batch = _batch_source(features, labels)
    if mode != stacks.ModeKeys.TRAIN or iterations == 1 or next_batch is None:
      return call(features, labels)
    spec, loss = _training_loop(call, next_batch, iterations)
    if not isinstance(spec, stacks.tpu.TPUEstimatorSpec):
      raise ValueError(
          f"the model_fn returned a {type(spec).__name__}; with "
          "--host_loop it runs in a loop, as on a TPU, and must return a "
          "TPUEstimatorSpec (or leave out --host_loop)")
    return stacks.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss, train_op=loss.op, scaffold_fn=spec.scaffold_fn,
        training_hooks=[*spec.training_hooks, SummaryWriterHook()])

  return looping_model_fn
