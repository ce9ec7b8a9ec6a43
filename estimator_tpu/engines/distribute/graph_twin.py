"""The model_fn built as TPUEstimator builds it, in a TF 1 graph with a session, beside the engine.

The distribute engine runs the model_fn in tf.functions, its variables made once
outside them (variables.py). Some of TPUEstimator's contract exists only in a
TF 1 graph and a session:

- a Scaffold's init_op / init_feed_dict / init_fn / local_init_op / ready_op /
  ready_for_local_init_op, which the Estimator's SessionManager runs when a
  session starts (init_fn(scaffold, session), e.g. slim's
  assign_from_checkpoint_fn or `saver.restore(session, path)`);
- variables whose initial value is a tensor (`tf.Variable(tf.random.normal(...))`,
  one computed from other variables), which TF 1 computes by its initializer
  ops under the graph's random seed;
- the MetaGraphDef beside each checkpoint (`model.ckpt-N.meta`) and graph.pbtxt
  in model_dir, which the Estimator's CheckpointSaverHook writes.

The twin is that graph: the program's model_fn called once in a fresh
tf.Graph, in TRAIN mode, as TPUEstimator (use_tpu=False) calls it in train()
(the graph's seed, TPUEstimator's global step, the input_fn's batch as the
Estimator iterates it, params as the engine gives them, then the Estimator's
loss summary and sharded Saver), with its Scaffold finalized. Its variables
have the engine's variables' names. It is built per train() call, and only
when something asks for it; nothing of it runs per step:

- a run that starts from nothing (no checkpoint in model_dir) starts a session
  of the twin as the Estimator's ChiefSessionCreator does (init_op with
  init_feed_dict, init_fn, local_init_op, the ready checks, warm start and
  init_from_checkpoint as initializers), and the engine's variables, every
  replica's copy, take its variables' values by name: the values TF 1 would
  have started from;
- a run that resumes runs local_init_op and the ready checks of a Scaffold
  that sets them, in the twin restored from the same checkpoint;
- each checkpoint the engine writes gets the twin's MetaGraphDef, with the
  Saver's SaverDef, as `.meta`; graph.pbtxt is written when training starts.

A twin can also be built in EVAL or PREDICT mode with SessionRunHooks whose
begin() needs the model's graph and whose after_create_session() a session
(a Saver over the model's variables built in begin(), restoring moving
averages after the checkpoint); their changes to the variables become the
engine's.

In the engine's own trace, a TPUEstimatorSpec's scaffold_fn is called in a
graph of its own that never runs (traced_scaffold): the Savers and
init_from_checkpoint it makes are recorded by the variable store, its ops are
not run at every step.
"""

import contextlib
import importlib
import inspect
import io
import logging
import random

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.framework import func_graph
from tensorflow.python.lib.io import file_io
from tensorflow.python.training import checkpoint_utils
from tensorflow.python.training import training_util
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import util as estimator_util
from tensorflow_estimator.python.estimator.tpu import tpu_estimator as tpu_estimator_lib

from estimator_tpu import stacks
from estimator_tpu.engines import calls
from estimator_tpu.engines.distribute import hooks as distribute_hooks
from estimator_tpu.engines.distribute import step_trace

ModeKeys = stacks.ModeKeys
GraphKeys = tf.compat.v1.GraphKeys
# What a Scaffold may set that runs in a session: at a fresh start, or at every start.
SESSION_FIELDS = ("init_op", "init_feed_dict", "init_fn", "local_init_op", "ready_op",
                  "ready_for_local_init_op")
EVERY_START = frozenset(("local_init_op", "ready_op", "ready_for_local_init_op"))
# The twin's session: the host's CPU, whatever devices the engine uses.
_SESSION_CONFIG = tf.compat.v1.ConfigProto(device_count={"GPU": 0, "TPU": 0},
                                           allow_soft_placement=True)
# Ops that only read or name state: a Scaffold's ops that reach no other are safe in a trace.
_READING_OPS = frozenset(("VarHandleOp", "ReadVariableOp", "VarIsInitializedOp",
                          "IsVariableInitialized", "Placeholder", "Const", "NoOp", "Identity"))


def traced_scaffold(scaffold_fn):
  """scaffold_fn() in the engine's trace, in a graph of its own that is never run.

  Its Savers and init_from_checkpoint calls are recorded by the variable
  store; the ops it makes (an init_op, an init_fn's Saver) stay out of the
  step, where every stateful op would run at every step.
  """
  graph = func_graph.FuncGraph("scaffold_fn")
  with graph.as_default(), _initializers_in_place(skipped=step_trace.replica_id() > 0):
    return scaffold_fn()


class _InPlace:
  """checkpoint_utils' distribute_lib within a traced scaffold_fn: no merge_call.

  init_from_checkpoint hands its work to a merge_call in a replica context,
  which under a MirroredStrategy may not cross into the scaffold's graph;
  this says "cross-replica" to it alone, so the work (which the variable
  store records) is done where it is called, in the replica's context.
  """

  @staticmethod
  def get_cross_replica_context():
    return True

  def __getattr__(self, name):
    return getattr(distribute_lib, name)


@contextlib.contextmanager
def _initializers_in_place(skipped):
  """Within, init_from_checkpoint records in place; with skipped, it does nothing.

  The first replica's calls are recorded, by the variables' names, which
  stand for every replica's copy; a later replica's would find its own
  copies under other names. Replicas trace one at a time.
  """
  saved = (checkpoint_utils.distribute_lib,
           checkpoint_utils._init_from_checkpoint)  # pylint: disable=protected-access
  checkpoint_utils.distribute_lib = _InPlace()
  if skipped:
    checkpoint_utils._init_from_checkpoint = lambda *args, **kwargs: None  # pylint: disable=protected-access
  try:
    yield
  finally:
    (checkpoint_utils.distribute_lib,
     checkpoint_utils._init_from_checkpoint) = saved  # pylint: disable=protected-access


def check_scaffold(scaffold, mode, store):
  """Notes what a traced Scaffold asks of a session; refuses what the engine cannot honour.

  Args:
    scaffold: the model_fn's Scaffold (or None), as traced.
    mode: the ModeKeys of the trace.
    store: the engine's VariableStore: its saver (for restoring) and its
      session work (store.session_work[mode]) are recorded there.

  Raises:
    UnsupportedHookError: a Scaffold op built in the step itself, or session
      work in EVAL / PREDICT that runs after the checkpoint is restored.
  """
  if scaffold is None:
    return
  fields = {name for name in SESSION_FIELDS if getattr(scaffold, "_" + name, None) is not None}
  for name in sorted(fields - {"init_fn", "init_feed_dict"}):
    _refuse_step_ops(name, getattr(scaffold, "_" + name))
  if mode != ModeKeys.TRAIN and fields & EVERY_START:
    raise distribute_hooks.UnsupportedHookError(
        f"the model_fn's Scaffold sets {', '.join(sorted(fields & EVERY_START))} in {mode} mode, "
        "which TF 1 runs after restoring the checkpoint; --engine=distribute runs a Scaffold's "
        "session work when training starts only: return it in TRAIN mode alone, or use "
        "--engine=estimator / ESTIMATOR_TPU_ENGINE=estimator")
  store.keep_saver(scaffold._saver)  # pylint: disable=protected-access
  store.session_work[mode] = frozenset(fields)


def _refuse_step_ops(field, value):
  """A Scaffold op made in the traced step would change state at every step: refused."""
  graph = tf.compat.v1.get_default_graph()
  # An op, a tensor, or what `variable.assign()` returns: each has its op.
  pending = [x if isinstance(x, tf.Operation) else getattr(x, "op", None)
             for x in tf.nest.flatten(value)]
  pending = [op for op in pending if isinstance(op, tf.Operation)]
  seen = set()
  while pending:
    op = pending.pop()
    if op.graph is not graph or op in seen:
      continue
    seen.add(op)
    if op.type not in _READING_OPS and op._is_stateful:  # pylint: disable=protected-access
      raise distribute_hooks.UnsupportedHookError(
          f"the model_fn's Scaffold {field} ({op.type} {op.name!r}) is built in the step "
          "--engine=distribute traces, where it would run at every step: build it in a "
          "TPUEstimatorSpec's scaffold_fn, which the engine calls in a graph of its own")
    pending.extend(t.op for t in op.inputs)
    pending.extend(op.control_inputs)


class GraphTwin:
  """The model_fn's graph as TPUEstimator builds it, with a session: built when asked.

  Args:
    model_fn: the program's model_fn.
    input_fn: the input_fn of this train() call (or evaluate(), predict()).
    params: () -> the params the engine gives the model_fn.
    input_params: () -> the params the engine gives the input_fn.
    run_config: the RunConfig a model_fn's `config` gets (or None).
    seed: RunConfig's tf_random_seed (or None).
    model_dir: the engine's model_dir.
    warm_start_from: a checkpoint (or its directory) of trainable variables
      to start from, or None.
    keep_checkpoint_max: the Estimator's Saver's max_to_keep.
    show_program_output: whether what the model_fn prints and logs while the
      twin is built is heard (the engine did not trace the model_fn in this
      train() call, where the Estimator calls it once); the input_fn's is not
      (the engine calls it at every train()).
    mode: the ModeKeys the graph is built in (TRAIN: as train() builds it).
    random_state: the RandomState the call began with (RandomState.now()),
      replayed while the input_fn and model_fn build the twin, so that what
      draws from Python's, NumPy's or Keras' random numbers (an unseeded Keras
      initializer's seed) draws what the Estimator's one build would; None:
      the draws as they come.
    hooks: SessionRunHooks whose begin() runs in the graph before it is
      finalized and whose after_create_session(session, coord) runs with the
      session, as MonitoredSession runs them (a hook that builds a Saver over
      the model's variables and restores in its session, as Inception v3's
      LoadEMAHook does): what they do to the variables is the engine's too.
  """

  def __init__(self, model_fn, input_fn, params, input_params, run_config, seed, model_dir,
               warm_start_from=None, keep_checkpoint_max=5, show_program_output=False,
               mode=ModeKeys.TRAIN, hooks=(), random_state=None):
    self._model_fn = model_fn
    self._input_fn = input_fn
    self._params = params
    self._input_params = input_params
    self._config = run_config
    self._seed = seed
    self._model_dir = model_dir
    self._warm_start_from = warm_start_from
    self._keep = keep_checkpoint_max
    self._show = show_program_output
    self._mode = mode
    self._hooks = list(hooks)
    self._random_state = random_state
    self._graph = None
    self._scaffold = None
    self._meta_graph = None

  @property
  def writes_graph(self):
    """Whether checkpoints get `.meta` files and model_dir a graph.pbtxt (RunConfig's say)."""
    return bool(getattr(self._config, "checkpoint_save_graph_def", True))

  def wanted_at_start(self, store):
    """Whether a run starting from nothing starts from the twin's session."""
    return bool(store.session_work.get(ModeKeys.TRAIN) or store.pending or self.writes_graph)

  def wanted_at_resume(self, store):
    """Whether a run resuming from a checkpoint has session work only the twin can do."""
    return bool(store.session_work.get(ModeKeys.TRAIN, frozenset()) & EVERY_START
                or store.pending)

  # Building.

  def _built(self):
    if self._graph is None:
      graph = tf.Graph()
      try:
        with graph.as_default(), _library_quiet():
          self._scaffold = self._build(graph)
      except Exception as e:
        e.add_note("(raised where --engine=distribute builds the model_fn in a TF 1 graph, as "
                   "TPUEstimator does, for a Scaffold's session work, tensor initial values and "
                   "the checkpoints' .meta files)")
        raise
      self._graph = graph
    return self._graph, self._scaffold

  def _build(self, graph):
    """TPUEstimator's graph of the mode, up to the session: returns its finalized Scaffold."""
    tf.compat.v1.random.set_random_seed(self._seed)
    tpu_estimator_lib._create_global_step(graph)  # pylint: disable=protected-access
    if self._mode == ModeKeys.TRAIN:
      training_util._get_or_create_global_step_read(graph)  # pylint: disable=protected-access
    with RandomState.replayed(self._random_state):
      with _program_output(shown=False):  # the engine called this input_fn itself
        with tf.compat.v1.device("/device:CPU:0"):
          result = _call_input_fn(self._input_fn, self._input_params(), self._config, self._mode)
        features, labels, _ = estimator_util.parse_input_fn_result(result)
      with _program_output(shown=self._show):
        spec = calls.call_model_fn(self._model_fn, features, labels, self._mode,
                                   self._params(), self._config)
        if isinstance(spec, model_fn_lib._TPUEstimatorSpec):  # pylint: disable=protected-access
          spec = spec.as_estimator_spec()  # calls its scaffold_fn and host_call
    if self._mode == ModeKeys.TRAIN:
      self._as_the_estimator_trains(spec)
    with _program_output(shown=True):
      for hook in self._hooks:
        hook.begin()
    scaffold = spec.scaffold
    scaffold.finalize()
    if scaffold.init_fn is not None:
      scaffold._init_fn = _with_program_voice(scaffold.init_fn)  # pylint: disable=protected-access
    return scaffold

  def _as_the_estimator_trains(self, spec):
    """What Estimator._train_with_estimator_spec adds to the graph before the session."""
    if self._warm_start_from and not tf.train.latest_checkpoint(self._model_dir):
      tf.compat.v1.train.warm_start(self._warm_start_from)
    if not any(x.op.name == "loss" for x in tf.compat.v1.get_collection(GraphKeys.SUMMARIES)):
      tf.compat.v1.summary.scalar("loss", spec.loss)
    tf.compat.v1.add_to_collection(GraphKeys.LOSSES, spec.loss)
    if not (spec.scaffold.saver or tf.compat.v1.get_collection(GraphKeys.SAVERS)):
      hours = getattr(self._config, "keep_checkpoint_every_n_hours", None) or 10000
      tf.compat.v1.add_to_collection(GraphKeys.SAVERS, tf.compat.v1.train.Saver(
          sharded=True, max_to_keep=self._keep, keep_checkpoint_every_n_hours=hours,
          defer_build=True, save_relative_paths=True))

  # The session.

  def start(self, store, strategy, checkpoint_path=None):
    """Starts the twin's session as the Estimator's would; the engine's variables take its values.

    Args:
      store: the engine's VariableStore.
      strategy: the engine's strategy (its variables are assigned in its scope).
      checkpoint_path: the checkpoint the run resumes from, or None (a fresh
        start: init_op, init_fn, ...).

    Raises:
      RuntimeError: the Scaffold's ops did not make the model ready (TF 1's).
      ValueError: a variable whose initial value is a tensor has no
        counterpart in the twin.
    """
    if self._graph is None and self._seed is None and _workers(strategy) > 1:
      self._seed = _shared_seed(strategy)  # every worker's twin the same random values
    graph, scaffold = self._built()
    with graph.as_default(), _library_quiet():
      creator = tf.compat.v1.train.ChiefSessionCreator(
          scaffold=scaffold, config=_SESSION_CONFIG, checkpoint_filename_with_path=checkpoint_path)
      session = creator.create_session()
      try:
        with _program_voice():
          for hook in self._hooks:
            hook.after_create_session(session, None)
        twins = {v.op.name: v for v in tf.compat.v1.global_variables()
                 + tf.compat.v1.local_variables()}
        values = session.run({name: twins[name] for name in store.variables if name in twins})
      finally:
        session.close()
    missing = sorted(store.pending - set(values))
    if missing:
      raise ValueError(
          f"variable {missing[0]!r}, whose initial value is a tensor, is not in the model_fn's "
          f"TF 1 graph ({self._mode} mode), where TF 1 would compute it; the graph has e.g. "
          f"{sorted(twins)[:5]}")
    with strategy.scope():
      for name, value in values.items():
        variable = store.variables[name]
        if not variable.shape.is_compatible_with(value.shape):
          raise ValueError(
              f"variable {name!r} is {variable.shape} in the engine's step but {value.shape} in "
              f"the model_fn's TF 1 graph ({self._mode} mode, the engine's params): its shape "
              "must not depend on how the engine calls the model_fn")
        variable.assign(value)
    store.pending.clear()

  # Files.

  def after_create_session(self):
    """graph.pbtxt in model_dir, as CheckpointSaverHook writes it when a session starts."""
    if not self.writes_graph:
      return
    graph, _ = self._built()
    with _library_quiet():
      tf.io.write_graph(graph.as_graph_def(add_shapes=True), self._model_dir, "graph.pbtxt")

  def after_save(self, checkpoint_path):
    """`checkpoint_path.meta`: the twin's MetaGraphDef with its Saver, as Saver.save writes it."""
    if not self.writes_graph:
      return
    if self._meta_graph is None:
      graph, scaffold = self._built()
      with graph.as_default(), _library_quiet():
        meta_graph = scaffold.saver.export_meta_graph()
      self._meta_graph = meta_graph.SerializeToString(deterministic=True)
    file_io.atomic_write_string_to_file(checkpoint_path + ".meta", self._meta_graph)


class RandomState:
  """Python's, NumPy's and Keras' random draws as they stood at one point of the program.

  Keras draws an unseeded initializer's seed from them (its seed generator
  after keras.utils.set_random_seed, else Python's or NumPy's), so building
  a model twice gives it other initial values: the twin replays the state its
  train() call began with, as the Estimator's one build of that call sees it.
  """

  def __init__(self, python, numpy, keras):
    self._python, self._numpy, self._keras = python, numpy, keras

  @classmethod
  def now(cls):
    generator = _keras_seed_generator()
    return cls(random.getstate(), np.random.get_state(),
               generator.getstate() if generator is not None else None)

  @classmethod
  @contextlib.contextmanager
  def replayed(cls, state):
    """Within: the draws from `state` (None: as they come); after: as they were before."""
    if state is None:
      yield
      return
    after = cls.now()
    state._set()  # pylint: disable=protected-access
    try:
      yield
    finally:
      after._set()  # pylint: disable=protected-access

  def _set(self):
    random.setstate(self._python)
    np.random.set_state(self._numpy)
    generator = _keras_seed_generator()
    if generator is not None and self._keras is not None:
      generator.setstate(self._keras)


def _keras_seed_generator():
  """The random.Random keras.utils.set_random_seed made for this thread, if any."""
  utils = importlib.import_module(stacks.keras.utils.set_random_seed.__module__)
  holder = getattr(getattr(utils, "backend", None), "_SEED_GENERATOR", None)
  return getattr(holder, "generator", None)


def _call_input_fn(input_fn, params, run_config, mode):
  """input_fn with the arguments its signature names, as TPUEstimator calls it off TPU."""
  names = inspect.signature(input_fn).parameters
  kwargs = {"params": params}
  if "config" in names:
    kwargs["config"] = run_config
  if "mode" in names:
    kwargs["mode"] = mode
  return input_fn(**kwargs)


def _workers(strategy):
  """How many processes run the strategy's replicas (MultiWorkerMirroredStrategy's workers)."""
  return strategy.num_replicas_in_sync // max(len(strategy.extended.worker_devices), 1)


def _shared_seed(strategy):
  """A random graph seed the workers agree on: the first replica's, by an all-reduce."""

  def replica():
    first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
    seed = tf.random.uniform([], maxval=2 ** 31 - 1, dtype=tf.int32)
    return tf.where(first, seed, tf.zeros_like(seed))

  pick = tf.function(lambda: strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica),
                                             axis=None), autograph=False)
  return int(pick())


_program_levels = []  # the log levels _library_quiet put aside, outermost first


@contextlib.contextmanager
def _library_quiet():
  """TensorFlow's own lines while the twin is built and its session starts: the engine speaks."""
  logger = tf.get_logger()
  _program_levels.append(logger.level)
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(_program_levels.pop())


@contextlib.contextmanager
def _program_voice():
  """Inside _library_quiet, the program's own code logs at the level the program set."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel(_program_levels[0] if _program_levels else level)
  try:
    yield
  finally:
    logger.setLevel(level)


@contextlib.contextmanager
def _program_output(shown):
  """The program's own lines while its code runs in the twin: heard, or kept out (stdout too)."""
  if shown:
    with _program_voice():
      yield
    return
  with contextlib.redirect_stdout(io.StringIO()):
    yield


def _with_program_voice(init_fn):
  """A Scaffold's init_fn (session) -> the same, heard (its saver.restore says what it restores)."""

  def init(session):
    with _program_voice():
      return init_fn(session)

  return init
