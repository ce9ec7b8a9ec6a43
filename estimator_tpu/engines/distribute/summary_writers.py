"""TF 2 summary writers made in the engine's traces (a model_fn's, a host_call's), as TF 1 had them.

A TF 1 model_fn may write TF 2 summaries itself (2020 self-supervised code):
`writer = tf2.summary.create_file_writer(model_dir)`, `with
tf.control_dependencies([writer.init()]): with writer.as_default(),
tf2.summary.record_if(cond): tf2.summary.scalar(..., step=global_step)`;
TPUEstimator's host_call makes its writer the same way. In TF 1 the writer
is a resource of the session: each train() or evaluate() call (a new
session) writes a new event file, flushed when the call ends. Inside a
tf.function `create_file_writer` makes it outside the function, eagerly,
once per trace. So, while the engine traces:

- every writer made is kept as long as the engine: its resource goes when
  the Python object does, and the traced step still writes through it;
- its file is not made then (a trace that never runs would leave an empty
  one): the engine makes it when a call first runs the traced function
  (`ready`), anew in each call, and flushes it when the call ends (`call`);
- `writer.init()` is an op: the engine initializes the writer, and the None
  it returns inside a trace would stop `tf.control_dependencies`;
- only the chief's first replica writes where the program says: the other
  replicas (whose model_fn writes the same tags at the same steps) and the
  other workers of a multi-worker run write into a scratch directory
  (workers.scratch_dir), removed when the process exits.
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.ops import gen_summary_ops
from tensorflow.python.ops import summary_ops_v2

# tf.summary's writer and tf.contrib.summary's (TF 1.15's) one.
_CLASSES = tuple(getattr(summary_ops_v2, name) for name in
                 ("_ResourceSummaryWriter", "_LegacyResourceSummaryWriter")
                 if hasattr(summary_ops_v2, name))
_thread = threading.local()


class _Writer:
  """One writer a trace made: its resource and how to make its file."""

  def __init__(self, resource, create):
    self.resource = resource
    self.create = create  # () -> makes the file (the writer's create_summary_file_writer)
    self.made = False  # its file was made in an earlier call
    self.ready = False  # its file was made in this call


class TracedWriters:
  """The summary writers of one engine's traces, by the name of the function traced.

  Args:
    workers: the engine's workers.Workers (who is the chief, its scratch dirs).
  """

  def __init__(self, workers):
    self._workers = workers
    self._by_function = {}

  @contextlib.contextmanager
  def tracing(self, function_name):
    """Within (the trace of function_name, in the thread that traces), writers are kept."""
    made = self._by_function.setdefault(function_name, [])
    originals = {cls: (cls.__dict__["__init__"], cls.__dict__.get("init", cls.init))
                 for cls in _CLASSES}
    create = gen_summary_ops.create_summary_file_writer
    for cls, (init, init_op) in originals.items():
      cls.__init__ = self._keeping(init, made)
      cls.init = _op_or_no_op(init_op)
    gen_summary_ops.create_summary_file_writer = self._deferred(create)
    try:
      yield
    finally:
      gen_summary_ops.create_summary_file_writer = create
      for cls, (init, init_op) in originals.items():
        cls.__init__ = init
        cls.init = init_op

  @contextlib.contextmanager
  def call(self):
    """One train(), evaluate() or predict() call: new files as its functions run, flushed after."""
    for writers in self._by_function.values():
      for writer in writers:
        writer.ready = False
    try:
      yield
    finally:
      for writers in self._by_function.values():
        for writer in writers:
          if writer.ready:
            gen_summary_ops.flush_summary_writer(writer.resource)

  def ready(self, function_name):
    """Makes the files of function_name's writers not yet made in this call (before it runs)."""
    for writer in self._by_function.get(function_name, []):
      if writer.ready:
        continue
      if writer.made:  # last call's file ends: TF 1 closed it with its session
        gen_summary_ops.close_summary_writer(writer.resource)
      writer.create()
      writer.made = writer.ready = True

  @contextlib.contextmanager
  def replica(self, replica_id):
    """Within (a replica's model_fn, in its thread), replicas after the first write aside."""
    before = getattr(_thread, "aside", None)
    _thread.aside = bool(replica_id) or not self._workers.is_chief
    try:
      yield
    finally:
      _thread.aside = before

  def _keeping(self, original, made):
    def init(writer, *args, **kwargs):
      _thread.pending = None  # the create of the writer being made, in this thread
      original(writer, *args, **kwargs)
      if _thread.pending is not None:  # made eagerly, as inside a trace
        made.append(_Writer(writer._resource, _thread.pending))  # pylint: disable=protected-access
        _thread.pending = None
    return init

  def _deferred(self, original):
    """create_summary_file_writer: eagerly, recorded for `ready` (its logdir aside if so)."""
    workers = self._workers

    def create_summary_file_writer(*args, **kwargs):
      aside = getattr(_thread, "aside", None)
      if aside is None:  # outside a replica (a host_call): the worker's own say
        aside = not workers.is_chief
      if aside:
        directory = workers.scratch_dir("summaries")
        if "logdir" in kwargs:
          kwargs["logdir"] = directory
        else:
          args = (args[0], directory, *args[2:])
      if not tf.executing_eagerly():
        return original(*args, **kwargs)
      _thread.pending = lambda: original(*args, **kwargs)
      return None
    return create_summary_file_writer


def _op_or_no_op(original):
  """A writer's init(): where it was made eagerly inside a trace, a no-op of the trace stands in."""
  def init(writer):
    op = original(writer)
    if op is None and not tf.executing_eagerly():
      return tf.no_op(name="summary_writer_initialized")
    return op
  return init
