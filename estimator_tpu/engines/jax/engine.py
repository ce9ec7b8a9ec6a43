"""--engine=jax: the TPUEstimator contract with each step lowered by TensorFlow and run by JAX.

TensorFlow's own accelerator builds end (no TPU build after 2.20, no CUDA 13
build); JAX runs on every TPU generation and today's GPUs. This engine runs
a TPUEstimator program's `input_fn` and `model_fn` there, unchanged:

- TensorFlow traces the model_fn as the distribute engine does (its variable
  store, the estimator's variable names, hooks, graph twin, checkpoints: this
  engine is that engine's subclass and differs only in who compiles and runs
  the step), once per replica step, for one replica's batch, on the host CPU;
- the replica step -- forward, gradients, the optimizer's update, metric
  updates -- is lowered by TensorFlow's XLA bridge for the platform JAX runs
  on, as a function of explicit state (lowering.py), and runs under
  `jax.jit` with `shard_map` on every device of one mesh (devices.py): each
  device is a replica, as each core of a TPU is; `CrossShardOptimizer` sums
  gradients over the replicas with XLA all-reduces, other TF 1 optimizers
  get the replicas' mean gradient (collectives.py); batch norm statistics
  stay per replica, as on a TPU;
- the variables live on the devices between steps (state.py) and go back to
  TensorFlow's variables for a checkpoint, the metric values and the run's
  end, so the model dir is the other engines' (the estimator engine resumes
  it, export.py exports it);
- the input_fn's tf.data pipeline runs on the host, as TPUEstimator's
  PER_HOST_V2 input does: called once per host with each replica's share of
  the batch (`params['batch_size']`), each replica taking the next batch;
  training dispatches `iterations_per_loop` steps back to back and waits
  for the device once per loop (steps.py);
- evaluation is exact over any number of devices: a last group of batches
  too short for every device runs with copies whose results are dropped;
- what the XLA bridge cannot lower (an op with no XLA kernel such as a
  py_func or a TF 2 summary in the step, a string tensor, a dynamic shape) is
  refused in one line naming it: the step must compile, as on a TPU.
"""

import jax
import numpy as np
import tensorflow as tf
from tensorflow.python.util import nest

from estimator_tpu.engines.distribute import engine as distribute_engine
from estimator_tpu.engines.distribute import inputs
from estimator_tpu.engines.distribute import replica_loss
from estimator_tpu.engines.distribute import step_trace
from estimator_tpu.engines.distribute import summary_writers
from estimator_tpu.engines.distribute import workers as workers_lib
from estimator_tpu.engines.jax import collectives
from estimator_tpu.engines.jax import devices as devices_lib
from estimator_tpu.engines.jax import host_tail
from estimator_tpu.engines.jax import hosts
from estimator_tpu.engines.jax import lowering
from estimator_tpu.engines.jax import randomness
from estimator_tpu.engines.jax import state as state_lib
from estimator_tpu.engines.jax import steps as steps_lib

ModeKeys = distribute_engine.ModeKeys
# The replica step's first argument: which replica it is (its random draws are its own).
REPLICA_ID = tf.TensorSpec([], tf.int32)
_features_and_labels = distribute_engine._features_and_labels  # pylint: disable=protected-access


class JaxEngine(distribute_engine.DistributeEngine):
  """Runs a TPUEstimator model_fn and its input_fns with every step on JAX's devices.

  Takes DistributeEngine's arguments but the strategy (TensorFlow only
  traces, on the host CPU), and:

  Args:
    devices: devices.Devices, the replicas (default: every JAX device).
  """

  def __init__(self, model_fn, params, model_dir, train_batch_size, eval_batch_size,
               predict_batch_size=None, devices=None, **kwargs):
    self.devices = devices or devices_lib.Devices(jax.devices())
    for name, batch in (("train_batch_size", train_batch_size),
                        ("eval_batch_size", eval_batch_size),
                        ("predict_batch_size", predict_batch_size)):
      if batch is not None:
        inputs.replica_batch(batch, self.devices.num_replicas, name)
    kwargs.pop("jit_compile", None)  # every step is compiled
    super().__init__(model_fn, params, tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir,
                     train_batch_size, eval_batch_size, predict_batch_size, **kwargs)
    self._state = state_lib.State(self._store, self.devices)
    self._workers = hosts.Hosts()  # process 0 writes; saves and stops are agreed
    self._writers = summary_writers.TracedWriters(self._workers)

  engine_name = "jax"

  @property
  def num_replicas(self):
    return self.devices.num_replicas

  def describe(self):
    """'jax (2 cpu devices)': what runs the model_fn."""
    return self.devices.describe()

  # The host's input: one input_fn call per host, each replica the next batch.

  def _dataset(self, input_fn, mode):
    context = tf.distribute.InputContext(self.devices.num_hosts, jax.process_index(),
                                         self.num_replicas)
    params, reads = workers_lib.watching_context(self._params(mode, context))
    if self._seed is not None:
      tf.random.set_seed(self._seed)
    dataset = inputs.host_dataset(input_fn, params, mode, self.config, context, self._seed)
    return workers_lib.shard_unless_read(dataset, bool(reads), context)

  # Variables: on the devices while steps run, TensorFlow's for everything else.

  def _restore(self, checkpoint_path=None, twin=None):
    path = super()._restore(checkpoint_path, twin)
    self._state.clear()
    self._state.pull()
    return path

  def _global_step(self):
    name = tf.compat.v1.GraphKeys.GLOBAL_STEP
    if name in self._state.values:
      return self._state.step_value(name)
    return super()._global_step()

  def _save(self, listeners):
    self._state.push([n for n in self._store.global_variables() if n in self._state.values])
    return super()._save(listeners)

  def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
    try:
      return super()._train(input_fn, hooks, steps, max_steps, saving_listeners)
    finally:
      self._state.push()

  def _graph_twin(self, *args, **kwargs):
    """The distribute engine's graph twin, its model_fn built as for one replica on the host.

    The twin's TF 1 graph runs in a session on the CPU, where a cross-replica
    sum (CrossShardOptimizer's) has no kernel: there it sums over one replica.
    """
    return _OneReplicaTwin(super()._graph_twin(*args, **kwargs))

  def _optimizer_rules(self):
    """TF 1 optimizers as on N TPU cores (collectives.py), not the strategy's rules."""
    return collectives.replicas(self.num_replicas, on_tpu=self._use_tpu)

  # The steps.

  def _train_function(self, carry=None):
    name = step_trace.function_name("train", carry)
    if name not in self._functions:
      self._functions[name] = _TrainStep(self, carry, name)
    return self._functions[name]

  def _eval_function(self, carry=None):
    name = step_trace.function_name("eval", carry)
    if name not in self._functions:
      self._functions[name] = _EvalStep(self, carry, name)
    return self._functions[name]

  def _predict_function(self, carry=None):
    name = step_trace.function_name("predict", carry)
    if name not in self._functions:
      self._functions[name] = _PredictStep(self, carry, name)
    return self._functions[name]

  def _replica_step(self, mode, carry, features, labels):
    """(the model_fn's spec for one replica, what it carries): the distribute engine's, traced."""
    with self._store.replicas(), self._store.outside():
      return self._replica_spec(features, labels, mode, carry)


class _OneReplicaTwin:
  """A graph_twin.GraphTwin whose every call builds and runs the model_fn as one replica."""

  def __init__(self, twin):
    self._twin = twin

  def __getattr__(self, name):
    value = getattr(self._twin, name)
    if not callable(value):
      return value

    def call(*args, **kwargs):
      with collectives.replicas(1):
        return value(*args, **kwargs)

    return call


class _HostValue:
  """A host value where the distribute engine's loop reads a tensor's `.numpy()`."""

  def __init__(self, value):
    self._value = np.asarray(value)

  def numpy(self):
    return self._value


class _Traced:
  """What the distribute engine's loop reads of a traced step: its structured outputs."""

  def __init__(self, structured_outputs):
    self.structured_outputs = structured_outputs


class _Step:
  """A mode's step on the JAX engine: traced by TensorFlow, lowered once per batch signature.

  The distribute engine's loop calls it as it calls that engine's
  tf.functions: `get_concrete_function(iterator, ...)` traces (the model_fn's
  variables are made then), then each call runs one step (or a loop of them).
  """

  mode = None

  def __init__(self, engine, carry, name):
    self._engine = engine
    self._carry = carry
    self.writers_key = name  # the summary writers its traces make (summary_writers.py)
    self._programs = {}  # flat per-replica batch signature -> (MeshStep, its layout)
    self.step_trace = None
    self.host_call = None
    self._host_function = None
    self._pending = None  # (iterator, a batch of a new shape that ended the last call's groups)
    self._tails = {}  # the trace's host_tail.HostTails, which its _Layout keeps

  def get_concrete_function(self, iterator, *unused_args):
    """Traces the step for the input's batches (the model_fn's variables are made now)."""
    element_spec = iterator.element_spec
    specs = _batch_specs(element_spec, self.mode)
    if all(spec.shape.is_fully_defined() for spec in specs):
      return _Traced(self._program(element_spec, specs)[1].structured)
    # Batches of a shape known only when they come: traced now, lowered per shape then.
    layout = _Layout()
    with self._engine._writers.tracing(self.writers_key):  # pylint: disable=protected-access
      tf.function(self._replica_fn(element_spec, layout), autograph=False).get_concrete_function(
          REPLICA_ID, *specs)
    return _Traced(layout.structured)

  def _program(self, element_spec, specs):
    """(the MeshStep of the replica step for batches of specs, its _Layout), lowered once."""
    if specs not in self._programs:
      self._programs[specs] = self._lower(element_spec, specs)
    return self._programs[specs]

  def _program_for(self, iterator, batch):
    """_program for a batch of host arrays from iterator."""
    specs = tuple(tf.TensorSpec(value.shape, spec.dtype) for value, spec in
                  zip(batch, _batch_specs(iterator.element_spec, self.mode)))
    return self._program(iterator.element_spec, specs)

  def _replica_fn(self, structure, layout):
    """The replica step as TensorFlow traces it: flat batch in, flat results and finals out."""
    engine = self._engine

    def replica(replica_id, *flat):
      features, labels = _features_and_labels(tf.nest.pack_sequence_as(structure, list(flat)))
      # In a replica context, where TF 1 optimizers apply gradients.
      with randomness.keyed(replica_id):
        results = engine.strategy.run(self.replica_results, args=(features, labels))
      layout.reductions = collectives.reductions_made()
      names = self.final_names()
      finals = [engine._store.variables[n].read_value() for n in names]  # pylint: disable=protected-access
      layout.set(results, names, dict(self._tails))
      return tf.nest.flatten(results) + finals

    return replica

  def _lower(self, structure, specs):
    engine = self._engine
    layout = _Layout()
    with engine._writers.tracing(self.writers_key):  # pylint: disable=protected-access
      lowered = lowering.LoweredStep(self._replica_fn(structure, layout), (REPLICA_ID, *specs),
                                     f"{self.mode} step of the model_fn",
                                     engine._store.variables.values())  # pylint: disable=protected-access
    self._check(layout, lowered)
    names = {v.ref(): n for n, v in engine._store.variables.items()}  # pylint: disable=protected-access
    unknown = [v.name for v in lowered.variables if v.ref() not in names]
    if unknown:
      raise lowering.LoweringError(
          f"the {lowered.name} reads the variable {unknown[0]!r}, made outside the model_fn's "
          "variables (a variable of the program's own, made before the model_fn ran): make it "
          "in the model_fn")
    mesh_step = steps_lib.MeshStep(lowered, names, layout.final_names, engine.devices,
                                   loop=self.mode == ModeKeys.TRAIN)
    engine._state.ensure(mesh_step.state_names)  # pylint: disable=protected-access
    return mesh_step, layout

  def _check(self, layout, lowered):
    del layout, lowered

  def final_names(self):
    """The variables whose values the step returns after its update."""
    raise NotImplementedError

  def replica_results(self, features, labels):
    raise NotImplementedError

  def _one_group(self, iterator):
    """Runs one group of batches (one per local replica; a short last one padded).

    Returns:
      (the step's results by name, stacked over the replicas; the program's
      layout; how many replicas' results are real).
    """
    engine = self._engine
    groups, short = self._groups(iterator, 1)
    group = groups[0] if groups else short
    mesh_step, layout = self._program_for(iterator, group[0])
    batch, real = steps_lib.stack_replicas(group, engine.devices.num_local)
    results = layout.unflatten(mesh_step(engine._state, batch, real))  # pylint: disable=protected-access
    kept = len(group) if engine.devices.num_hosts == 1 else engine.num_replicas
    return results, layout, kept

  def _groups(self, iterator, count):
    """Up to count groups of one batch per local replica, as flat host arrays, all one shape.

    A batch of another shape than the first ends the groups; it begins the
    next call's (each shape is a step compiled for it).

    Returns:
      (complete groups, the batches of a last group too short for every
      replica); raises OutOfRangeError when the input has no batch left.
    """
    num_local = self._engine.devices.num_local
    groups, group, shapes = [], [], None
    if self._pending and self._pending[0] is not iterator:
      self._pending = None
    try:
      while len(groups) < count:
        if self._pending:
          batch, self._pending = self._pending[1], None
        else:
          batch = [t.numpy() for t in tf.nest.flatten(iterator.get_next())]
        if shapes is None:
          shapes = [b.shape for b in batch]
        elif [b.shape for b in batch] != shapes:
          self._pending = (iterator, batch)
          break
        group.append(batch)
        if len(group) == num_local:
          groups.append(group)
          group = []
    except tf.errors.OutOfRangeError:
      if not groups and not group:
        raise
    return groups, group


class _Layout:
  """Where each part of a replica step's flat results is."""

  def __init__(self):
    self.structured = None
    self.final_names = []
    self.reductions = 0
    self.tails = {}

  def set(self, results, final_names, tails):
    self.structured = results
    self.final_names = list(final_names)
    self.tails = tails

  def unflatten(self, flat):
    """The step's results as host values of TensorFlow's dtypes (JAX holds 64-bit ones in 32)."""
    tensors = tf.nest.flatten(self.structured)
    values = [np.asarray(value).astype(tensor.dtype.as_numpy_dtype, copy=False)
              for tensor, value in zip(tensors, flat)]
    return tf.nest.pack_sequence_as(self.structured, values)


class _TrainStep(_Step):
  """iterations_per_loop training steps per call: (last loss, {key: [steps, ...]} carried)."""

  mode = ModeKeys.TRAIN

  def replica_results(self, features, labels):
    engine = self._engine
    spec, carried = engine._replica_step(ModeKeys.TRAIN, self._carry, features, labels)  # pylint: disable=protected-access
    if spec.train_op is None or spec.loss is None:
      raise ValueError("the model_fn returned no train_op or no loss in TRAIN mode")
    host_call = getattr(spec, "host_call", None)
    self.host_call = host_call
    with tf.control_dependencies([spec.train_op]):
      loss = tf.identity(spec.loss)
    host_tensors = tf.nest.map_structure(
        lambda t: tf.reshape(t, [1]) if t.shape.rank == 0 else t,
        host_call[1] if host_call else [])
    tail = self._tails["carried"] = host_tail.HostTail(carried)
    return {"loss": loss, "host": host_tensors, "carried": tail.device,
            "carried_frontier": tail.frontier}

  def final_names(self):
    return list(self._engine._store.variables)  # pylint: disable=protected-access

  def _check(self, layout, lowered):
    trainable = [v for v in lowered.variables if v.trainable]
    if self._engine.num_replicas > 1 and trainable and not layout.reductions:
      raise collectives.CollectiveError(
          f"the model_fn's train_op updates {len(trainable)} trainable variable(s) with no "
          f"gradient sum over the {self._engine.num_replicas} replicas: the JAX engine averages "
          "the gradients of TF 1 optimizers (tf.compat.v1.train.Optimizer and its subclasses, "
          "CrossShardOptimizer); use one, or run on one device (--strategy=one_device)")

  def __call__(self, iterator, count):
    engine = self._engine
    groups, _ = self._groups(iterator, int(count))
    if not groups:
      raise tf.errors.OutOfRangeError(None, None, "the input_fn's data ended")
    mesh_step, layout = self._program_for(iterator, groups[0][0])
    results = layout.unflatten(mesh_step(engine._state, steps_lib.stack_steps(groups)))  # pylint: disable=protected-access
    self._run_host_calls(results["host"], len(groups))
    loss = np.mean(results["loss"][-1])
    carried = {key: value[:, 0] for key, value in results["carried"].items()}
    carried.update(layout.tails["carried"].stacked(results["carried_frontier"],
                                                   [(i, 0) for i in range(len(groups))]))
    if len(groups) < int(count):  # the data ended within the loop: the steps it had ran
      raise tf.errors.OutOfRangeError(None, None, "the input_fn's data ended")
    return _HostValue(loss), {key: _HostValue(v) for key, v in carried.items()}

  def _run_host_calls(self, host_tensors, steps):
    """The host_call once per step, over the replicas' tensors concatenated, as TPUEstimator's."""
    if self.host_call is None:
      return
    fn, engine = self.host_call[0], self._engine
    key = (self.writers_key, "host_call")
    if self._host_function is None:

      def host_call(tensors):
        with engine._writers.tracing(key):  # pylint: disable=protected-access
          engine._run_host_call(fn, tensors)  # pylint: disable=protected-access

      self._host_function = tf.function(host_call, autograph=False)
    joined = [tf.nest.map_structure(lambda t, i=i: t[i].reshape((-1,) + t.shape[3:]),
                                    host_tensors) for i in range(steps)]
    self._host_function.get_concrete_function(joined[0])  # its writers are made now
    engine._writers.ready(key)  # pylint: disable=protected-access
    for tensors in joined:
      self._host_function(tensors)


class _EvalStep(_Step):
  """One evaluation step per call: (loss, metric_fn tensors, {key: [1, ...]} carried)."""

  mode = ModeKeys.EVAL

  def replica_results(self, features, labels):
    engine = self._engine
    spec, carried = engine._replica_step(ModeKeys.EVAL, self._carry, features, labels)  # pylint: disable=protected-access
    metrics = getattr(spec, "eval_metrics", None)
    engine._metric_fn = metrics[0] if metrics else None  # pylint: disable=protected-access
    loss, examples = replica_loss.weighted(spec.loss, features, labels)
    tail = self._tails["carried"] = host_tail.HostTail(carried)
    return {"loss": loss, "examples": examples, "metrics": metrics[1] if metrics else [],
            "carried": tail.device, "carried_frontier": tail.frontier}

  def final_names(self):
    return sorted(self._engine._store.local_names)  # pylint: disable=protected-access

  def get_concrete_function(self, iterator, *unused_args):
    traced = super().get_concrete_function(iterator)
    structured = traced.structured_outputs
    replicas = self._engine.num_replicas
    # The metric_fn's tensors are the replicas' concatenated, as TPUEstimator's.
    metrics = tf.nest.map_structure(
        lambda t: tf.TensorSpec([None if t.shape[0] is None else t.shape[0] * replicas,
                                 *t.shape[1:]], t.dtype) if t.shape.rank else t,
        structured["metrics"])
    return _Traced((structured["loss"], metrics, structured["carried"]))

  def __call__(self, iterator):
    engine = self._engine
    results, layout, kept = self._one_group(iterator)
    engine._state.push(layout.final_names)  # pylint: disable=protected-access
    loss = np.sum(results["loss"][:kept]) / max(np.sum(results["examples"][:kept]), 1.0)
    metrics = tf.nest.map_structure(lambda t: tf.constant(_joined(t[:kept])), results["metrics"])
    carried = {key: value[:1] for key, value in results["carried"].items()}
    carried.update(layout.tails["carried"].stacked(results["carried_frontier"], [(0,)]))
    return (_HostValue(np.float32(loss)), metrics,
            {key: _HostValue(v) for key, v in carried.items()})


class _PredictStep(_Step):
  """One prediction step per call: ({name: predictions}, {key: [1, ...]} carried)."""

  mode = ModeKeys.PREDICT

  def replica_results(self, features, labels):
    del labels
    engine = self._engine
    spec, carried = engine._replica_step(ModeKeys.PREDICT, self._carry, features, None)  # pylint: disable=protected-access
    predictions = spec.predictions
    are_dict = isinstance(predictions, dict)
    if not are_dict:
      predictions = {"predictions": predictions}
    engine._predictions = (list(predictions), are_dict)  # pylint: disable=protected-access
    tail = self._tails["predictions"] = host_tail.HostTail(predictions)
    carried_tail = self._tails["carried"] = host_tail.HostTail(carried)
    return {"predictions": tail.device, "frontier": tail.frontier,
            "carried": carried_tail.device, "carried_frontier": carried_tail.frontier}

  def final_names(self):
    return []

  def __call__(self, iterator):
    results, layout, kept = self._one_group(iterator)
    predictions = dict(results["predictions"])
    predictions.update(layout.tails["predictions"].concatenated(results["frontier"], kept))
    predictions = {k: _HostValue(_joined(v[:kept]) if k in results["predictions"] else v)
                   for k, v in predictions.items()}
    carried = {key: value[:1] for key, value in results["carried"].items()}
    carried.update(layout.tails["carried"].stacked(results["carried_frontier"], [(0,)]))
    return predictions, {key: _HostValue(value) for key, value in carried.items()}


def _joined(per_replica):
  """`[replicas, n, ...]` as the replicas' values concatenated, `[replicas * n, ...]`."""
  per_replica = np.asarray(per_replica)
  if per_replica.ndim == 1:
    return per_replica
  return per_replica.reshape((-1,) + per_replica.shape[2:])


def _batch_specs(element_spec, mode):
  """A replica batch's flat TensorSpecs; what a JAX step cannot take refused naming the tensor."""
  specs = []
  for path, spec in _flatten_with_paths(element_spec):
    if not isinstance(spec, tf.TensorSpec):
      raise lowering.LoweringError(
          f"the {mode} input's {path or 'element'} is a {type(spec).__name__}: a JAX step "
          "takes dense tensors; make it dense in the input_fn")
    if spec.dtype == tf.string:
      raise lowering.LoweringError(
          f"the {mode} input's {path or 'element'} is a string tensor: JAX devices hold no "
          "strings; decode or look it up in the input_fn")
    specs.append(tf.TensorSpec(spec.shape, spec.dtype))
  return tuple(specs)


def _flatten_with_paths(structure):
  """[(path, leaf)] of a batch's structure in tf.nest's order: '0/image', '1' (the labels)."""
  return nest.flatten_with_joined_string_paths(structure)
