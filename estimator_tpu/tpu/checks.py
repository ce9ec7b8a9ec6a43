"""TPU checks on CPU: XLA-compile one core's step (either engine's); build TPUEstimator's TPU graph.

Nothing here needs a TPU. Whether a TPU can run each op of the step is
decided by a table of the ops TensorFlow's TPU compiler supports
(tpu_ops.txt, read from the TPU build by scripts/make_tpu_op_table.py), the
same on every TensorFlow; the step is then compiled by XLA's CPU backend and
run on a real batch, which checks shapes and everything else, and the
TPU graph is built (never run) against a stand-in TPU system. For
--engine=distribute the engine's own TRAIN and EVAL functions are compiled,
as one replica of a TPUStrategy runs them. The tpu stack's TensorFlow has no
XLA for the CPU: there the step is built, not compiled, and its finding says
to run the preflight on the current stack.
"""

import contextlib
import dataclasses
import functools
import os
import re
import tempfile
import time
from unittest import mock
import warnings

import tensorflow as tf
from tensorflow.python.compiler.xla import xla
from tensorflow.python.tpu import tpu_system_metadata
from tensorflow.python.tpu.ops import tpu_ops
from tensorflow_estimator.python.estimator.tpu import error_handling

from estimator_tpu import stacks
from estimator_tpu import tf_startup
from estimator_tpu.engines import calls
from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.model import device_augmentation

ModeKeys = stacks.ModeKeys
XLA_COMPILE_ATTR = "_xla_compile_id"
NO_HOST_XLA = ("this stack's TensorFlow, the TPU build (tensorflow-tpu), has no XLA for the CPU; "
               "run --preflight on the current stack (make install, then .venv/bin/python "
               "train.py --preflight with the same flags)")
PY_FUNC_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
# Ops that may touch strings without putting a string tensor on the TPU.
STRING_OK_OPS = ("Const", "Assert", "NoOp")
CORES_PER_HOST = 8
STAND_IN_MASTER = "grpc://10.0.0.2:8470"
_UNSUPPORTED = re.compile(
    r"(\w+) \(No registered '\w+' OpKernel for \w+ devices compatible with node "
    r"\{\{node ([^}]+)\}\}")
_LIBRARY_DIRS = ("site-packages", "dist-packages", os.path.dirname(__file__))


@dataclasses.dataclass(frozen=True)
class UnsupportedOp:
  """An op XLA cannot compile, with the scope (layer) and source line that made it."""
  op_type: str
  node: str
  scope: str
  created_at: str


@dataclasses.dataclass
class TrainStep:
  """What compiling and running one core's training step showed.

  Attributes:
    loss: the loss of the step, or None when it did not run.
    error: the error that stopped it ('' when it ran).
    unsupported: UnsupportedOp for each op XLA (on this CPU) rejected.
    outside_table: UnsupportedOp for each op not in the table of ops TPUs compile.
    ops: the ops of the compiled computation (the model's forward and backward pass).
    cross_replica_sums: gradient sums CrossShardOptimizer asked for.
    seconds: time to compile and run.
  """
  loss: float = None
  error: str = ""
  unsupported: list = dataclasses.field(default_factory=list)
  outside_table: list = dataclasses.field(default_factory=list)
  ops: list = dataclasses.field(default_factory=list)
  cross_replica_sums: int = 0
  summaries: list = dataclasses.field(default_factory=list)
  seconds: float = 0.0


SUMMARY_CALLS = ("scalar", "histogram", "image", "audio", "text")


@contextlib.contextmanager
def summary_calls():
  """Records the tf.summary / tf.compat.v1.summary calls made inside; yields the list.

  Inside a TPU computation (and xla.compile) TensorFlow skips summary ops
  without a word, so the calls are what shows them: 'tf.compat.v1.summary.scalar(loss)'.
  """
  calls = []
  patches = []
  for prefix, module in (("tf.compat.v1.summary", tf.compat.v1.summary),
                         ("tf.summary", tf.summary)):
    for name in SUMMARY_CALLS:
      original = getattr(module, name, None)
      if original is None:
        continue

      def spy(*args, _original=original, _api=f"{prefix}.{name}", **kwargs):
        summary_name = kwargs.get("name", args[0] if args else "")
        calls.append(f"{_api}({summary_name!r})")
        return _original(*args, **kwargs)

      patches.append(mock.patch.object(module, name, spy))
  with contextlib.ExitStack() as stack:
    for patch in patches:
      stack.enter_context(patch)
    yield calls


@contextlib.contextmanager
def one_core_cross_replica_sum():
  """Makes CrossReplicaSum the identity (its value on one core); yields a call counter.

  XLA on CPU has no CrossReplicaSum kernel, and a sum over one core is the
  value itself, so the step compiles exactly as one TPU core would run it.
  """
  calls = []

  def identity_sum(x, group_assignment=None, name=None):
    del group_assignment
    calls.append(x.name)
    return tf.identity(x, name=name or "CrossReplicaSum")

  with mock.patch.object(tpu_ops, "cross_replica_sum", identity_sum):
    yield calls


def _source_line(op):
  """'file:line' of the innermost frame outside libraries that created op."""
  for frame in reversed(op.traceback):
    filename = frame.filename
    if not any(part in filename for part in _LIBRARY_DIRS):
      return f"{os.path.relpath(filename)}:{frame.lineno}"
  return ""


def parse_unsupported_ops(message, graph):
  """UnsupportedOp for each op named in XLA's 'Detected unsupported operations' error."""
  found = {}
  for op_type, node in _UNSUPPORTED.findall(message):
    try:
      created_at = _source_line(graph.get_operation_by_name(node))
    except (KeyError, ValueError):
      created_at = ""  # inside a function body: the name is all there is
    found[node] = UnsupportedOp(op_type, node, node.rpartition("/")[0] or node, created_at)
  return list(found.values())


_DETECTED_AT = re.compile(r"Detected at node '?([^' ]+)'? defined at")
# TF 2's wrapping of a graph error: no news in them, the cause comes after.
_BOILERPLATE = ("Graph execution error:", "<stack traces unavailable>")


def first_line(error):
  """The line of an error message worth printing: XLA's verdict, else the first with news.

  TF 2 wraps graph errors as 'Graph execution error: Detected at node X defined
  at ...'; that wrapping is replaced by the cause, prefixed with the node.
  """
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  detected = [line for line in lines if "Detected unsupported" in line]
  if detected:
    return detected[0]
  node = next((m.group(1) for m in map(_DETECTED_AT.search, lines) if m), None)
  news = [line for line in lines if line not in _BOILERPLATE and not _DETECTED_AT.search(line)
          and not line.startswith(("File ", "[[", "(most recent call last)"))]
  text = (news or lines or [type(error).__name__])[0]
  return f"node {node}: {text}" if node else text


def _eval_tensors(spec):
  """The tensors an EVAL step sends to the host: eval_metrics' tensors (TPU side)."""
  eval_metrics = getattr(spec, "eval_metrics", None)
  if isinstance(eval_metrics, (tuple, list)) and len(eval_metrics) == 2:
    return tf.nest.flatten(eval_metrics[1])
  return []


def _build_step(model_fn, input_fn, params, mode):
  """Builds the compiled step of `mode` in the default graph; returns the loss tensor.

  TRAIN runs forward, loss, gradients and the update; EVAL runs forward, loss
  and the tensors its eval_metrics send to the host (TPUEstimator computes
  the metrics themselves on the host).
  """
  features, labels = tf.compat.v1.data.make_one_shot_iterator(input_fn(params)).get_next()
  tf.compat.v1.train.get_or_create_global_step()
  structure = (features, labels)

  def step(*tensors):
    features, labels = tf.nest.pack_sequence_as(structure, list(tensors))
    # The estimators run every model_fn behind device_augmentation.with_device_augmentation.
    spec = calls.call_model_fn(
        device_augmentation.with_device_augmentation(model_fn), features, labels, mode, params)
    after = [spec.train_op] if mode == ModeKeys.TRAIN else _eval_tensors(spec)
    with tf.control_dependencies(after):
      return tf.identity(spec.loss)

  tf_startup.quiet_first_xla_compile()
  (loss,) = xla.compile(step, inputs=tf.nest.flatten(structure))
  return loss


def compile_train_step(model_fn, input_fn, params, mode=ModeKeys.TRAIN):
  """XLA-compiles one TPU core's step on CPU and runs it on one real batch.

  Args:
    model_fn: a TPUEstimator model_fn; called in `mode` with params as a
      TPU core would see them.
    input_fn: the input_fn of that mode.
    params: params including `batch_size` (per core) and `use_tpu` (True).
    mode: ModeKeys.TRAIN or ModeKeys.EVAL.

  Returns:
    A TrainStep.
  """
  result = TrainStep()
  began = time.time()
  graph = tf.Graph()
  with graph.as_default(), one_core_cross_replica_sum() as sums, summary_calls() as summaries:
    try:
      loss = _build_step(model_fn, input_fn, params, mode)
    except Exception as e:
      result.error = (f"the model_fn failed in {mode.upper()} mode: {type(e).__name__}: "
                      f"{first_line(e)}")
      return result
    result.ops = [op for op in graph.get_operations() if XLA_COMPILE_ATTR in op.node_def.attr]
    result.outside_table = ops_outside_tpu_table(result.ops, graph)
    result.cross_replica_sums = len(sums)
    result.summaries = list(summaries)
    if not stacks.HOST_XLA:
      result.error = NO_HOST_XLA
      return result
    with tf.compat.v1.Session(graph=graph) as session:
      try:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.local_variables_initializer(),
                     tf.compat.v1.tables_initializer()])
        result.loss = float(session.run(loss))
      except tf.errors.OpError as e:
        result.error = first_line(e.message)
        result.unsupported = parse_unsupported_ops(e.message, graph)
  result.seconds = time.time() - began
  return result


def compile_engine_steps(model_fn, input_fns, params, batch_sizes):
  """XLA-compiles the distribute engine's steps on CPU, as one TPU replica runs them; one run each.

  The engine is the one --engine=distribute builds, on one CPU
  (OneDeviceStrategy) instead of a TPUStrategy, with params['use_tpu'] True
  (the model_fn takes its TPU branches) and jit_compile; its model_dir and
  params['model_dir'] are a temporary directory, removed afterwards.

  Args:
    model_fn: a TPUEstimator model_fn.
    input_fns: [(mode, input_fn)], TRAIN first, EVAL optional.
    params: the run's params as a TPU run builds them (no batch_size).
    batch_sizes: {mode: per-replica batch} (global batch / --num_cores).

  Returns:
    {mode: TrainStep}; `ops` are those of the replica step's graph.
  """
  steps = {}
  with tempfile.TemporaryDirectory(prefix="preflight-") as model_dir:
    engine = distribute_engine.DistributeEngine(
        device_augmentation.with_device_augmentation(model_fn), dict(params, model_dir=model_dir),
        tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir,
        batch_sizes[ModeKeys.TRAIN], batch_sizes.get(ModeKeys.EVAL, batch_sizes[ModeKeys.TRAIN]),
        use_tpu=True, iterations_per_loop=1, jit_compile=stacks.HOST_XLA, replica_function=True)
    for mode, input_fn in input_fns:
      steps[mode] = _engine_step(engine, input_fn, mode)
      if not stacks.HOST_XLA and not steps[mode].error:
        steps[mode].error = NO_HOST_XLA  # built and run, not compiled
  return steps


def _engine_step(engine, input_fn, mode):
  result = TrainStep()
  began = time.time()
  tf_startup.quiet_first_xla_compile()
  with summary_calls() as summaries, warnings.catch_warnings():
    # A TF 1 summary op traced with no default writer says so; its WARN line says more.
    warnings.filterwarnings("ignore", message="Cannot activate TF2 compatibility support")
    try:
      result.loss = engine.run_one_step(input_fn, mode)
    except tf.errors.OpError as e:
      result.error = first_line(e.message)
      graph = engine.step_graphs.get(mode)
      result.unsupported = parse_unsupported_ops(e.message, graph) if graph else []
    except Exception as e:  # the model_fn (or input_fn) failed while traced
      result.error = (f"the model_fn failed in {mode.upper()} mode: {type(e).__name__}: "
                      f"{first_line(e)}")
  graph = engine.step_graphs.get(mode)
  result.ops = graph.get_operations() if graph is not None else []
  result.outside_table = ops_outside_tpu_table(result.ops, graph)
  result.summaries = list(dict.fromkeys(summaries))  # the model_fn is traced more than once
  result.seconds = time.time() - began
  return result


TPU_OPS_FILE = os.path.join(os.path.dirname(__file__), "tpu_ops.txt")
TPU_OPS_SCRIPT = "scripts/make_tpu_op_table.py"


@functools.lru_cache(maxsize=None)
def tpu_op_table():
  """(TensorFlow version the table was read from, frozenset of the op names a TPU compiles)."""
  with open(TPU_OPS_FILE) as f:
    lines = f.read().splitlines()
  version = re.search(r"TPU build (\S+)", "\n".join(lines[:3])).group(1)
  return version, frozenset(line for line in lines if line and not line.startswith("#"))


# Ops no XLA kernel stands for: TPU replication plumbing the TPU rewrite consumes, and the
# resource-variable handles a TPU computation receives as arguments.
TPU_REWRITE_OPS = frozenset((
    "TPUReplicatedInput", "TPUReplicatedOutput", "TPUReplicateMetadata", "TPUCompilationResult",
    "TPUPartitionedInput", "TPUPartitionedInputV2", "TPUPartitionedOutput",
    "TPUPartitionedOutputV2", "VarHandleOp", "VarIsInitializedOp", "Placeholder"))


def _function_nodes(library, attr_values, seen):
  """(function name, NodeDef) of every node in the functions attr_values call, recursively."""
  nodes = []
  for value in attr_values:
    names = [value.func.name] if value.func.name else [f.name for f in value.list.func]
    for name in names:
      if name in seen or name not in library:
        continue
      seen.add(name)
      for node in library[name].node_def:
        nodes.append((name, node))
        nodes += _function_nodes(library, node.attr.values(), seen)
  return nodes


def ops_outside_tpu_table(ops, graph=None):
  """UnsupportedOp for each op among ops (and the functions they call) a TPU cannot compile.

  The verdict is the table's (tpu_ops.txt), so it is the same whatever XLA the
  installed TensorFlow has for the CPU. Python callbacks and string ops are left to
  forbidden_ops, which says why.
  """
  _, table = tpu_op_table()
  allowed = table | TPU_REWRITE_OPS | frozenset(PY_FUNC_OPS)
  forbidden = {op.name for op in forbidden_ops(ops)}
  outside = {op.name: UnsupportedOp(op.type, op.name, op.name.rpartition("/")[0] or op.name,
                                    _source_line(op))
             for op in ops if op.type not in allowed and op.name not in forbidden}
  library = {}
  if graph is not None:
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
  called = [value for op in ops for value in op.node_def.attr.values()]
  for function, node in _function_nodes(library, called, set()):
    if node.op not in allowed and node.op not in library:
      name = f"{function}/{node.name}"
      outside.setdefault(name, UnsupportedOp(node.op, name, node.name.rpartition("/")[0]
                                             or function, ""))
  return list(outside.values())


def forbidden_ops(ops):
  """Ops a TPU core cannot run whatever XLA says: Python callbacks and string tensors."""
  bad = []
  for op in ops:
    tensors = list(op.inputs) + list(op.outputs)
    if op.type in PY_FUNC_OPS or (op.type not in STRING_OK_OPS and
                                  any(t.dtype == tf.string for t in tensors)):
      bad.append(op)
  return bad


# Dtypes a TPU core has no support for at all (float64 only runs slowly: a WARN).
TPU_MISSING_DTYPES = (tf.complex128,)


def missing_dtype_tensors(ops):
  """Tensors among ops' outputs whose dtype a TPU lacks, e.g. complex128."""
  return [t for op in ops for t in op.outputs if t.dtype in TPU_MISSING_DTYPES]


def float64_ops(ops):
  """Ops computing in float64, which TPUs do slowly if at all."""
  return [op for op in ops if any(t.dtype == tf.float64 for t in op.outputs)]


def is_backward(op):
  return "gradients" in op.name.split("/")


def layer_widths(ops):
  """(layer, kind, fan_in, width) of each forward Conv2D and MatMul among ops.

  The layer is the op's name scope; fan_in is the number of inputs per
  output (kernel height x width x input channels for a convolution).
  """
  layers = []
  for op in ops:
    if is_backward(op) or op.type not in ("Conv2D", "MatMul"):
      continue
    kernel = op.inputs[1].shape
    if not kernel.is_fully_defined():
      continue
    if op.type == "Conv2D":
      height, width, channels, outputs = kernel.as_list()
      layers.append((op.name.rpartition("/")[0], "conv", height * width * channels, outputs))
    else:
      rows, columns = kernel.as_list()
      inputs, outputs = (columns, rows) if op.get_attr("transpose_b") else (rows, columns)
      layers.append((op.name.rpartition("/")[0], "dense", inputs, outputs))
  return layers


def forward_matrix_ops(ops):
  """Forward Conv2D/MatMul ops: the layers a TPU's matrix units run."""
  return [op for op in ops if op.type in ("Conv2D", "MatMul") and not is_backward(op)]


def bfloat16_ops(ops):
  """Forward Conv2D/MatMul ops that compute in bfloat16."""
  return [op for op in forward_matrix_ops(ops) if op.outputs[0].dtype == tf.bfloat16]


def stand_in_resolver(unused_runtime=None):
  """A cluster resolver for a TPU that is never contacted."""
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": [STAND_IN_MASTER.replace("grpc://", "")]}),
      master=STAND_IN_MASTER)


def stand_in_tpu_system(num_cores):
  """TPU system metadata for num_cores cores, 8 per host."""
  hosts = max(1, num_cores // CORES_PER_HOST)
  return tpu_system_metadata.TPUSystemMetadata(
      num_cores=num_cores, num_hosts=hosts, num_of_cores_per_host=num_cores // hosts,
      topology=None, devices=[])


def build_tpu_graph(estimator, input_fn, mode, num_cores):
  """Builds, never runs, the graph a TPUEstimator (use_tpu=True) makes for num_cores cores.

  Args:
    estimator: a TPUEstimator built with use_tpu=True, e.g. with
      stand_in_resolver as its cluster resolver.
    input_fn: the input_fn for mode.
    mode: ModeKeys.TRAIN or ModeKeys.EVAL.
    num_cores: TPU cores the stand-in TPU system reports.

  Returns:
    The tf.Graph; TPU computations live in its function library.
  """
  metadata = stand_in_tpu_system(num_cores)
  with mock.patch.object(tpu_system_metadata, "_query_tpu_system_metadata",
                         return_value=metadata):
    graph = tf.Graph()
    with graph.as_default():
      tf.compat.v1.train.get_or_create_global_step()
      estimator._rendezvous[mode] = error_handling.ErrorRendezvous(3)
      features, labels, _ = estimator._get_features_and_labels_from_input_fn(input_fn, mode)
      estimator._call_model_fn(features, labels, mode, estimator.config)
  return graph


def graph_op_types(graph):
  """Op types in graph and in every function of its library."""
  graph_def = graph.as_graph_def()
  types = {node.op for node in graph_def.node}
  for function in graph_def.library.function:
    types.update(node.op for node in function.node_def)
  return types
