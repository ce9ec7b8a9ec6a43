"""What an input_fn returns, as the tf.data pipeline the distribute engine's strategy distributes.

TPUEstimator (with use_tpu=False the Estimator's
`_get_features_and_labels_from_input_fn`, on a TPU `_InputPipeline` and
`_Inputs`) accepts from an input_fn a `tf.data.Dataset` of
`(features, labels)` or of features alone, or
`(features, labels)` / features as tensors or dicts of tensors built in the
estimator's TF 1 graph (an iterator's `get_next()`, constants, queues fed by
queue runners). The engine calls the input_fn the same way and keeps what it
gave:

- the input_fn runs in a TF 1 graph of its own, made as the estimator makes
  its graph before calling it: the RunConfig's `tf_random_seed` as the graph's
  seed, the global step created first, the ops on the CPU. TF 1 code runs as
  written (graph mode, `make_one_shot_iterator`, queues), and a seeded
  shuffle draws the same order as on the estimator;
- a Dataset is carried out of that graph whole (its serialized graph, which
  `dataset_from_graph` rebuilds where the strategy places the host's input),
  when its ops need nothing of that graph's session: random ops, py_funcs and
  initialized lookup tables carry over;
- anything else (tensors, or a Dataset that reads the graph's variables or
  queues) is run by a session on that graph, once per batch, as the
  estimator's session runs it (variables, tables and local variables
  initialized, queue runners started), and the batches stream into the
  pipeline (`from_generator`) with the tensors' static shapes. The input ends
  where that session raises OutOfRangeError, as the estimator's input does.

Batch sizes stay global, as TPUEstimator's are: each replica's input_fn batch
(`params['batch_size']`) is the global batch's share (replica_batch()).
"""

import contextlib

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import options as options_lib
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import gen_experimental_dataset_ops
from tensorflow.python.training import training_util
from tensorflow.python.util import function_utils
from tensorflow_estimator.python.estimator.tpu import tpu_estimator

from estimator_tpu import stacks

ModeKeys = stacks.ModeKeys

# Stateful ops a serialized Dataset may hold and still run outside its graph's session:
# random ops (their seeds are attributes), py_funcs (registered in this process; the
# graph is kept alive), initialized lookup tables, which the serialization rebuilds, and
# assertions and prints, which hold no state.
_PORTABLE_STATEFUL = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc", "HashTableV2",
                                "LookupTableFindV2", "LookupTableSizeV2", "Assert", "Print",
                                "PrintV2", "_Arg", "_Retval"})


def replica_batch(global_batch, num_replicas, name):
  """The replica's share of a global batch (None stays None on one replica).

  Args:
    global_batch: the global batch (train_batch_size, eval_batch_size, ...).
    num_replicas: the strategy's replicas in sync.
    name: the TPUEstimator argument that gave the batch, for messages.

  Raises:
    ValueError: the batch does not divide by the replicas, or is None with
      more than one replica to share it.
  """
  if global_batch is None:
    if num_replicas == 1:
      return None
    raise ValueError(f"{name} is None: the {num_replicas} replicas each need a share of a "
                     f"global batch; give TPUEstimator({name}=N) with N a multiple of "
                     f"{num_replicas}")
  if global_batch % num_replicas:
    lower = global_batch // num_replicas * num_replicas
    raise ValueError(
        f"{name}={global_batch} must be divisible by the {num_replicas} replicas; try "
        f"{lower or num_replicas} or {lower + num_replicas}")
  return global_batch // num_replicas


def call_input_fn(input_fn, params, mode, config, input_context):
  """Calls input_fn with the arguments its signature names, as TPUEstimator's _call_input_fn."""
  args = function_utils.fn_args(input_fn)
  if "params" not in args:
    raise ValueError(f"input_fn ({input_fn}) does not include params argument, required by "
                     "TPUEstimator to pass batch size as params[\"batch_size\"]")
  kwargs = {"params": params}
  for name, value in (("config", config), ("mode", mode), ("input_context", input_context)):
    if name in args:
      kwargs[name] = value
  return input_fn(**kwargs)


def host_dataset(input_fn, params, mode, config, input_context, seed=None):
  """The host's input as a tf.data.Dataset of what the input_fn gave, built as said above.

  Called where the strategy builds a host's input (inside
  distribute_datasets_from_function's dataset_fn, eagerly).

  Args:
    input_fn: the program's input_fn.
    params: what params the input_fn gets (batch share and context set).
    mode: the ModeKeys value.
    config: the RunConfig an input_fn with a `config` argument gets.
    input_context: the tf.distribute.InputContext of the call.
    seed: the RunConfig's tf_random_seed, the input graph's seed.

  Returns:
    A Dataset whose elements are (features, labels) or features.
  """
  graph = tf.Graph()
  with graph.as_default():
    _as_the_estimator_begins(graph, mode, seed)
    with tf.compat.v1.device("/device:CPU:0"):
      result = call_input_fn(input_fn, params, mode, config, input_context)
    if isinstance(result, tf.compat.v2.data.Dataset):
      _check_element(result.element_spec, "Dataset whose elements are")
      graph_def = _portable_graph_def(graph, result)
      if graph_def is None:
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        source = GraphBatches(graph, iterator.get_next(), [iterator.initializer])
      element_spec = result.element_spec
    else:
      graph_def = None
      source = GraphBatches(graph, _element(result), [])
  if graph_def is not None:
    variant = gen_experimental_dataset_ops.dataset_from_graph(graph_def)
    dataset = dataset_ops._VariantDataset(variant, element_spec)  # pylint: disable=protected-access
    dataset.input_graph = graph  # the py_funcs its ops call are registered by that graph
    return dataset
  return source.dataset()


def _as_the_estimator_begins(graph, mode, seed):
  """What the estimator's graph holds when it calls the input_fn: its seed and global step."""
  tf.compat.v1.set_random_seed(seed)
  tpu_estimator._create_global_step(graph)  # pylint: disable=protected-access
  if mode == ModeKeys.TRAIN:  # Estimator._train_model_default reads it before the input_fn
    training_util._get_or_create_global_step_read(graph)  # pylint: disable=protected-access


def _check_element(structure, what):
  if isinstance(structure, (tuple, list)) and len(structure) != 2:
    raise ValueError(
        f"input_fn should return (features, labels) as a len 2 tuple: it returned a {what} "
        f"a {type(structure).__name__} of {len(structure)}")


def _element(result):
  """(features, labels) tensors, or features alone, as the Estimator parses an input_fn's result."""
  _check_element(result, "")
  if isinstance(result, (tuple, list)):
    features, labels = result
    return features if labels is None else (features, labels)
  return result


def _portable_graph_def(graph, dataset):
  """The Dataset's serialized graph when it runs without graph's session, else None."""
  ignore = options_lib.ExternalStatePolicy.IGNORE
  with graph.as_default():
    serialized = dataset._as_serialized_graph(external_state_policy=ignore)  # pylint: disable=protected-access
  with tf.compat.v1.Session(graph=graph, config=_session_config()) as session:
    try:
      graph_def = session.run(serialized)
    except tf.errors.OpError:
      return None  # e.g. it reads a placeholder: the session runs it, or says why not
  parsed = tf.compat.v1.GraphDef.FromString(graph_def)
  op_types = {node.op for node in parsed.node}
  op_types.update(node.op for function in parsed.library.function for node in function.node_def)
  return graph_def if all(_portable(op_type) for op_type in op_types) else None


def _portable(op_type):
  op_def = op_def_registry.get(op_type)
  if op_def is None or not op_def.is_stateful:
    return op_def is not None
  return (op_type in _PORTABLE_STATEFUL or op_type.endswith("Dataset")
          or op_type.rstrip("0123456789").endswith("DatasetV")
          or any(attr.name == "seed2" for attr in op_def.attr))


def _session_config():
  return tf.compat.v1.ConfigProto(allow_soft_placement=True, use_per_session_threads=True)


class GraphBatches:
  """A session on an input_fn's graph that runs its tensors once per batch, as a Dataset.

  Args:
    graph: the input_fn's graph.
    element: the tensors of one batch, (features, labels) or features.
    initializers: ops to run first beside the graph's variable, local variable
      and table initializers (e.g. a Dataset iterator's).
  """

  def __init__(self, graph, element, initializers):
    self._graph = graph
    with graph.as_default():
      self._specs = tf.nest.map_structure(tf.type_spec_from_value, element)
      self._fetches = tf.nest.flatten(element, expand_composites=True)
      self._initializers = [tf.compat.v1.global_variables_initializer(),
                            tf.compat.v1.local_variables_initializer(),
                            tf.compat.v1.tables_initializer(), *initializers]
    self._flat_specs = tuple(tf.TensorSpec(t.shape, t.dtype) for t in self._fetches)

  def __call__(self):
    """Yields each batch's flat values until the graph's input ends."""
    with self._session() as session:
      while True:
        try:
          values = session.run(self._fetches)
        except tf.errors.OutOfRangeError:
          return
        yield tuple(values)

  @contextlib.contextmanager
  def _session(self):
    session = tf.compat.v1.Session(graph=self._graph, config=_session_config())
    coordinator = tf.compat.v1.train.Coordinator()
    threads = []
    try:
      session.run(self._initializers)
      if self._graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        threads = tf.compat.v1.train.start_queue_runners(session, coordinator)
      yield session
    finally:
      coordinator.request_stop()
      session.close()  # closes the queues, so their runners end
      coordinator.join(threads, stop_grace_period_secs=10, ignore_live_threads=True)

  def dataset(self):
    specs = self._specs
    dataset = tf.data.Dataset.from_generator(self, output_signature=self._flat_specs)
    return dataset.map(
        lambda *flat: tf.nest.pack_sequence_as(specs, list(flat), expand_composites=True))
