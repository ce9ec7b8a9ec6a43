"""TF 1 model code inside tf.functions: its variables made once, by their estimator names.

A TPUEstimator model_fn creates its variables as it builds the graph
(`tf.compat.v1.get_variable`, `tf.compat.v1.layers`, Keras layers, optimizer
slots, the global step, metric accumulators) and finds them again through
graph collections (`minimize()` reads TRAINABLE_VARIABLES). Inside a
tf.function every trace builds a new graph, so the distribute engine calls
the model_fn inside `VariableStore.scope()`:

- a variable asked for the first time is created at once, outside the
  function (`tf.init_scope`), under the strategy's scope, as the strategy's
  distributed variable, and named as the estimator names it (the name scopes
  the engine's own loop adds are left out); it is made unlifted
  (`experimental_enable_variable_lifting=False`), so tf.function does not
  count it as made by its first trace and trace the model_fn again for it;
- a variable asked for again, in a later trace or another function, is the
  one made before: one set of variables serves training, evaluation and
  prediction, and a checkpoint of either engine restores into it by name;
- every variable handed out is added to the collections TF 1 would have put
  it in, in the graph being traced, so `minimize()`, `trainable_variables()`
  and `get_or_create_global_step()` find it; tensors and variables hash by
  identity, as in TF 1;
- `tf.compat.v1.train.init_from_checkpoint` (BERT's pre-trained weights)
  sets initializers in TF 1, which run once, when a run starts from nothing;
  inside a function its assign ops would run at every step: here each is
  recorded instead (`checkpoint_initializers`), and the engine assigns them
  once, at a fresh start;
- `variable.op.name`, which TF 1 code reads for a variable's name (moving
  averages' `variables_to_restore()`, weight-decay filters), is the
  variable's name although the variable was made outside the trace, and
  `variable.graph` is the graph being built (hooks check it);
- a `tf.compat.v1.train.Saver` built in a trace builds no ops; the one that
  is the model_fn's Scaffold's saver (e.g. restoring moving averages for
  evaluation) has its {checkpoint name: variable} map kept (`savers`) for the
  engine's restore, others (an init_fn's) are not restores of the model;
- a variable whose initial value is a tensor computed in the trace (a random
  tensor, one computed from other variables) is made with zeros of its shape
  and listed in `pending`: TF 1's value is computed in the model_fn's TF 1
  graph (graph_twin.py) when a run starts from nothing, or the checkpoint's
  is restored; in the trace, the `initial_value` of a variable made outside
  it is a read of the variable (TF 1's tensor is the twin's), so an op that
  uses it while training reads the variable's value; its `initializer` is a
  no-op (`tf.compat.v1.global_variables_initializer()` in model code builds);
- under a MirroredStrategy the replicas after the first are traced in their
  own name scopes, where Keras numbers its layers anew (`conv_bn_1`): they get
  the first replica's variables in the order of the names with those numbers
  taken off, as TensorFlow's own shared variable creator matches them.
"""

import collections
import contextlib
import re
import threading

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops import variable_scope
from tensorflow.python.training import checkpoint_utils
from tensorflow.python.training import saver as saver_lib

from estimator_tpu.engines.distribute import step_trace

GraphKeys = tf.compat.v1.GraphKeys
# Collections a trace starts empty: TF 1 built each graph once.
_PER_TRACE = (GraphKeys.GLOBAL_VARIABLES, GraphKeys.LOCAL_VARIABLES,
              GraphKeys.TRAINABLE_VARIABLES, GraphKeys.MODEL_VARIABLES,
              GraphKeys.METRIC_VARIABLES, GraphKeys.UPDATE_OPS, GraphKeys.LOSSES,
              GraphKeys.REGULARIZATION_LOSSES, GraphKeys.SUMMARIES,
              GraphKeys.TRAINABLE_RESOURCE_VARIABLES, GraphKeys.GLOBAL_STEP,
              # tf.compat.v1.variable_scope's stores: a default_name
              # (`kernel/Momentum`) is numbered anew in each trace, as in a new graph.
              variable_scope._VARSCOPESTORE_KEY, variable_scope._VARSTORE_KEY)  # pylint: disable=protected-access
# What tf.Variable takes of what tf.compat.v1.Variable is given.
_VARIABLE_ARGS = ("initial_value", "trainable", "validate_shape", "dtype", "constraint",
                  "synchronization", "aggregation", "shape")
_REPLICA_SCOPE = re.compile(r"(^|/)replica_\d+(?=/|$)")


def _keras_graph(graph):
  """Whether graph is one Keras (2) builds a functional model's layers in, outside functions."""
  name = getattr(graph, "name", None) or ""
  return name == "keras_graph" or name.endswith("_scratch_graph")
_UNIQUIFIED = re.compile(r"_\d+(?=/|$)")


class _VariableOp:
  """What TF 1 code reads of a variable's op: its name, type and graph.

  The graph is one for every such variable, whatever thread asks (replica
  threads each have a default graph of their own): TF 1 optimizers key their
  slots by (op.graph, op.name).
  """
  type = "VarHandleOp"
  traceback = None  # read by TF 2.15's DistributedVariable.op
  _graph = None

  def __init__(self, name):
    self.name = name

  @property
  def graph(self):
    if _VariableOp._graph is None:
      _VariableOp._graph = tf.Graph()
    return _VariableOp._graph


_BaseVariable = resource_variable_ops.BaseResourceVariable
_graph_op = _BaseVariable.op
_handle_graph = _BaseVariable.graph
_initial_value = _BaseVariable.initial_value
_initializer = _BaseVariable.initializer
# TensorFlow's own functions, put back when the last trace in any thread leaves.
_SET_INITIALIZER = checkpoint_utils._set_checkpoint_initializer  # pylint: disable=protected-access
_SAVER_BUILD = saver_lib.Saver._build  # pylint: disable=protected-access
_patch_lock = threading.Lock()
_patch_depth = [0]


def _op_or_name(variable):
  try:
    return _graph_op.fget(variable)
  except AttributeError:  # made eagerly: "Tensor.op is undefined when eager execution..."
    pass
  # One replica's copy answers with the distributed variable's name, as in TF 1.
  container = getattr(variable, "_distributed_container", None)
  named = container() if callable(container) else None
  return _VariableOp((named or variable).name.split(":")[0])


def _graph_or_default(variable):
  """A variable's graph; one made outside every graph is in the graph being built, as in TF 1."""
  if tf.is_symbolic_tensor(variable.handle):
    return _handle_graph.fget(variable)
  return tf.compat.v1.get_default_graph()


def _initial_value_or_read(variable):
  """A variable's initial value; for one made outside the trace, a read of it stands in."""
  value = _initial_value.fget(variable)
  if value is None and not tf.executing_eagerly():
    # Not constant: a variable initialized from it waits for TF 1's value (pending).
    return tf.identity(variable.read_value())
  return value


def _initializer_or_no_op(variable):
  """A variable's initializer; for one made outside the trace (and initialized), a no-op."""
  op = _initializer.fget(variable)
  if op is None and not tf.executing_eagerly():
    return tf.no_op(name="initialized_outside")
  return op


class InitialValueError(ValueError):
  """A variable's initial value is a tensor of the traced graph whose shape is not known."""


def _canonical(name):
  """A name with the replica scope and Keras' layer numbers taken off."""
  return _UNIQUIFIED.sub("", _REPLICA_SCOPE.sub("", name)).strip("/")


def _collections_of(kwargs):
  names = list(kwargs.get("collections") or [GraphKeys.GLOBAL_VARIABLES])
  trainable = kwargs.get("trainable")
  on_read = kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ
  if trainable is None:
    trainable = not on_read
  if trainable and GraphKeys.LOCAL_VARIABLES not in names:
    names.append(GraphKeys.TRAINABLE_VARIABLES)
  return names


def _add_once(graph, name, value):
  if not any(item is value for item in graph.get_collection(name)):
    graph.add_to_collection(name, value)


def _traced_tensor(value):
  return isinstance(value, tf.Tensor) and tf.is_symbolic_tensor(value)


def _placeholder_initial_value(name, value, kwargs):
  """Zeros in the shape and dtype of a traced initial value (TF 1's value comes later)."""
  shape = tf.TensorShape(kwargs.get("shape") or value.shape)
  if not shape.is_fully_defined():
    raise InitialValueError(
        f"variable {name!r} is initialized from a tensor of shape {shape} computed in the "
        "model_fn; under --engine=distribute variables are made once, outside the traced step, "
        "and need a known shape: give the tensor a static shape, or the variable an "
        "initializer (tf.compat.v1.get_variable(..., shape=..., initializer=...))")
  dtype = tf.as_dtype(kwargs.get("dtype") or value.dtype).base_dtype
  return lambda: tf.zeros(shape, dtype)


class _Trace:
  """What one strategy.run trace has handed out, for the replicas after the first."""

  def __init__(self):
    self.first = collections.defaultdict(list)  # canonical name -> variables, in order
    self.taken = collections.defaultdict(lambda: collections.defaultdict(int))


class VariableStore:
  """The variables of one model, made once (in the strategy scope the engine holds), by name.

  Attributes:
    variables: {estimator name: variable}, in the order they were made.
    local_names: the names of local variables (metric and host_call state):
      never checkpointed, as the estimator's Saver leaves them out.
  """

  def __init__(self):
    self.variables = {}
    self.local_names = set()
    self.checkpoint_initializers = {}  # variable name -> (variable, checkpoint file, tensor name)
    self.savers = []  # {checkpoint name: variable} of each Scaffold's Saver
    self.pending = set()  # names of variables whose TF 1 initial value is still to come
    self.session_work = {}  # mode -> the Scaffold fields that need a session (graph_twin)
    self._built_savers = {}  # (thread, id) -> (Saver, {checkpoint name: variable}), per call
    self._making = threading.local()
    self._traced = threading.local()  # .graph: the graph this thread's model code is traced in
    self._bases = []
    self._trace = None

  @contextlib.contextmanager
  def scope(self):
    """Calls of model code inside a trace: variables from this store, collections as in TF 1."""
    graph = tf.compat.v1.get_default_graph()
    with tf.init_scope():
      outer = tf.compat.v1.get_default_graph()  # where slots are made (init_scope)
    # The allow-listed variable collections of a FuncGraph are the outer graph's
    # own lists: they are emptied for the call and given back after it.
    saved = {(g, name): list(g.get_collection(name))
             for g in {graph, outer} for name in _PER_TRACE}
    for g, name in saved:
      del g.get_collection_ref(name)[:]
    self._bases.append(graph.get_name_scope())
    outer_graph, self._traced.graph = getattr(self._traced, "graph", None), graph
    try:
      with tf.compat.v1.variable_creator_scope(self._creator), self._recording():
        yield
    finally:
      self._traced.graph = outer_graph
      self._bases.pop()
      for (g, name), items in saved.items():
        g.get_collection_ref(name)[:] = items
      thread = threading.get_ident()
      for key in [k for k in self._built_savers if k[0] == thread]:
        del self._built_savers[key]

  @contextlib.contextmanager
  def _recording(self):
    """init_from_checkpoint's initializers and Savers built in the trace: recorded, not built.

    The replicas of a MirroredStrategy trace in threads that enter and leave
    in any order: TensorFlow's functions are replaced when the first enters
    and put back when the last leaves.
    """
    store = self

    def record_initializer(variable, ckpt_file, tensor_name, slice_spec, name=None):
      del name
      if slice_spec:
        raise ValueError(f"init_from_checkpoint of the partitioned variable {tensor_name!r} "
                         "is not supported by --engine=distribute")
      store.checkpoint_initializers[store._name_of(variable)] = (variable, ckpt_file,
                                                                 tensor_name)

    def record_saver(saver, checkpoint_path, build_save, build_restore):
      del checkpoint_path, build_save, build_restore
      if store._trace is not None and store._replica_id():
        return  # a later replica's copy of the first's Saver, its names in the replica's scope
      var_list = saver._var_list  # pylint: disable=protected-access
      if not isinstance(var_list, dict):
        var_list = {store._name_of(v): v for v in (var_list or store.global_variables().values())}
      store._built_savers[(threading.get_ident(), id(saver))] = (saver, dict(var_list))

    with _patch_lock:
      _patch_depth[0] += 1
      if _patch_depth[0] == 1:
        checkpoint_utils._set_checkpoint_initializer = record_initializer  # pylint: disable=protected-access
        saver_lib.Saver._build = record_saver  # pylint: disable=protected-access
        _BaseVariable.op = property(_op_or_name)
        _BaseVariable.graph = property(_graph_or_default)
        _BaseVariable.initial_value = property(_initial_value_or_read)
        _BaseVariable.initializer = property(_initializer_or_no_op)
        _patch_depth.append(tf.Tensor._USE_EQUALITY)  # pylint: disable=protected-access
        # TF 1 hashed tensors and variables by identity (`set(tf.trainable_variables())`).
        tf.compat.v1.disable_tensor_equality()
    try:
      yield
    finally:
      with _patch_lock:
        _patch_depth[0] -= 1
        if _patch_depth[0] == 0:
          checkpoint_utils._set_checkpoint_initializer = _SET_INITIALIZER  # pylint: disable=protected-access
          saver_lib.Saver._build = _SAVER_BUILD  # pylint: disable=protected-access
          _BaseVariable.op = _graph_op
          _BaseVariable.graph = _handle_graph
          _BaseVariable.initial_value = _initial_value
          _BaseVariable.initializer = _initializer
          if _patch_depth.pop():
            tf.compat.v1.enable_tensor_equality()

  def keep_saver(self, saver):
    """The model_fn's Scaffold's Saver (built in this call) restores the model: its map is kept."""
    built = self._built_savers.get((threading.get_ident(), id(saver)))
    if saver is None or built is None or built[0] is not saver:
      return
    var_list = built[1]
    # One per Saver, however often it is traced (by names and variables' identity).
    seen = {tuple(sorted((n, id(v)) for n, v in known.items())) for known in self.savers}
    if tuple(sorted((n, id(v)) for n, v in var_list.items())) not in seen:
      self.savers.append(var_list)

  def _name_of(self, variable):
    for name, known in self.variables.items():
      if known is variable:
        return name
    return variable.name.split(":")[0]

  @contextlib.contextmanager
  def replicas(self):
    """One strategy.run trace: replicas after the first get the first one's variables."""
    self._trace = _Trace()
    try:
      yield
    finally:
      self._trace = None

  @contextlib.contextmanager
  def outside(self):
    """Creation of variables outside any trace (the strategy's own creator must run)."""
    with tf.compat.v1.variable_creator_scope(self._creator):
      yield

  def _key(self, kwargs):
    name = kwargs.get("name") or "Variable"
    name = name.name if hasattr(name, "name") else str(name)
    if name.endswith("/"):
      # An absolute name (an optimizer's slots): no name scope applies, nor the
      # scope of a cond branch in the model code (a loss-scale optimizer's update).
      return name.rstrip("/")
    scope = self._name_scope()
    key = f"{scope}/{name}" if scope else name
    for base in sorted({b for b in self._bases if b}, key=len, reverse=True):
      if key.startswith(base + "/"):
        key = key[len(base) + 1:]
        break
    return key.rstrip("/")

  def _name_scope(self):
    """The name scope a variable made now gets its name in, as in the model_fn's TF 1 graph.

    Keras builds a functional model's layers (called on `tf.keras.Input`) in
    graphs of its own, whose name scopes start at the top; in TF 1 they were
    built in the model_fn's graph, inside the model_fn's scopes (a
    `variable_scope` around the model): those come first.
    """
    graph = tf.compat.v1.get_default_graph()
    scope = graph.get_name_scope()
    traced = getattr(self._traced, "graph", None)
    if traced is None or graph is traced or not _keras_graph(graph):
      return scope
    outer = traced.get_name_scope()
    return "/".join(part for part in (outer, scope) if part)

  def _replica_id(self):
    """The replica being traced, counted on this worker: 0 for its first (multi-worker too)."""
    if tf.distribute.in_cross_replica_context():
      return None
    return step_trace.replica_id()

  def _creator(self, next_creator, **kwargs):
    if getattr(self._making, "active", False):
      return next_creator(**kwargs)
    key = self._key(kwargs)
    replica = self._replica_id() if self._trace is not None else None
    if replica:  # a later replica of a MirroredStrategy trace
      variable = self._from_first_replica(key)
    else:
      variable = self.variables[key] if key in self.variables else self._make(key, kwargs)
      if self._trace is not None and replica == 0:
        self._trace.first[_canonical(key)].append(variable)
    graph = tf.compat.v1.get_default_graph()
    for name in _collections_of(kwargs):
      _add_once(graph, name, variable)
    return variable

  def _from_first_replica(self, key):
    canonical = _canonical(key)
    made = self._trace.first[canonical]
    taken = self._trace.taken[threading.get_ident()]
    if taken[canonical] >= len(made):
      raise ValueError(f"replica asked for variable {key!r}, which the first replica did not make")
    taken[canonical] += 1
    return made[taken[canonical] - 1]

  def _make(self, key, kwargs):
    local = GraphKeys.LOCAL_VARIABLES in (kwargs.get("collections") or ())
    kwargs = {k: v for k, v in kwargs.items() if k in _VARIABLE_ARGS}
    initial_value = kwargs.get("initial_value")
    if _traced_tensor(initial_value):
      static = tf.get_static_value(initial_value)
      if static is None:
        kwargs["initial_value"] = _placeholder_initial_value(key, initial_value, kwargs)
        self.pending.add(key)
      else:
        kwargs["initial_value"] = static
    # A trailing "/" makes the name absolute: no name scope of the trace is added.
    kwargs["name"] = key + "/"
    self._making.active = True
    try:
      # Out of the trace, through the creators of the strategy's scope, which
      # the engine holds open around every trace. Not lifted: made here, it is
      # not one of the variables tf.function's first trace makes, for which
      # tf.function would trace the whole model_fn a second time.
      with tf.init_scope():
        variable = tf.Variable(**kwargs, experimental_enable_variable_lifting=False)
    finally:
      self._making.active = False
    self.variables[key] = variable
    if local:
      self.local_names.add(key)
    return variable

  def global_variables(self):
    """{name: variable} of everything a checkpoint holds (local variables left out)."""
    return {k: v for k, v in self.variables.items() if k not in self.local_names}
