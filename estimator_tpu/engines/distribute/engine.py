"""--engine=distribute: the TPUEstimator contract in tf.functions under a tf.distribute strategy.

TPUEstimator drives a TPU through TF 1 sessions and the stream-executor TPU
runtime, which only TPUs v2-v4 offer; TPUs on the PJRT runtime (v5e, v5p,
v6e) run TensorFlow only through `tf.distribute.TPUStrategy`. This engine
runs the same `input_fn(params)` and `model_fn(features, labels, mode,
params)` returning a TPUEstimatorSpec there, and on CPUs and GPUs:

- training calls one tf.function per `iterations_per_loop` steps (a loop
  inside the function, as TPUEstimator loops on the TPU); each step runs the
  model_fn on every replica (`strategy.run`), its host_call on the host
  with the replicas' tensors concatenated, as TPUEstimator's outfeed does;
- the TF 1 model code keeps its variables through tf1_variables.VariableStore
  (made once, as the strategy's variables, with the estimator's names), so
  a checkpoint of either engine restores into the other;
- gradients are combined across replicas exactly once, by the strategy, as
  the mean of the replicas' gradients (CrossShardOptimizer's MEAN; its
  CrossReplicaSum is left out, the strategy does that sum: optimizer_rules);
- evaluation runs the model_fn per replica and its eval_metrics' metric_fn
  once on the host over the concatenated tensors, as TPUEstimator does;
- checkpoints are the Saver's name-based `model.ckpt-N`; the SavedModel is
  exported by the estimator from the same checkpoint (export/saved_model.py);
- what needs a TF 1 graph and session (a Scaffold's init_fn and init ops,
  tensor initial values, the `.meta` beside each checkpoint) is done in the
  model_fn's graph twin (graph_twin.py), once per train() call, off the steps.

The engine presents TF 2.15's whole TPUEstimator API (surface.py: the same
methods, arguments, NumPy results, files and INFO lines, voice.py), so loop.py
and a TPUEstimator program do not know which they drive.
SessionRunHooks (given to train / evaluate / predict or returned by the
model_fn) run as in a MonitoredSession, each step's before_run / after_run
replayed in step order after the loop with the tensors they asked for
(distribute/hooks.py); an EstimatorSpec's eval_metric_ops are updated in the
evaluation step and read at its end (distribute/metric_ops.py).
"""

import contextlib
import copy
import functools
import os
import warnings

import tensorflow as tf
from tensorflow_estimator.python.estimator.tpu import tpu_estimator as tpu_estimator_lib

from estimator_tpu import stacks
from estimator_tpu.engines import calls
from estimator_tpu.engines import strategies
from estimator_tpu.engines import tpu_estimator
from estimator_tpu.engines.distribute import checkpoint_timing
from estimator_tpu.engines.distribute import context as input_context_lib
from estimator_tpu.engines.distribute import eval_metrics
from estimator_tpu.engines.distribute import event_files
from estimator_tpu.engines.distribute import graph_twin
from estimator_tpu.engines.distribute import hooks as distribute_hooks
from estimator_tpu.engines.distribute import inputs
from estimator_tpu.engines.distribute import metric_ops
from estimator_tpu.engines.distribute import monitors
from estimator_tpu.engines.distribute import optimizer_rules
from estimator_tpu.engines.distribute import replica_loss
from estimator_tpu.engines.distribute import step_trace
from estimator_tpu.engines.distribute import summary_writers
from estimator_tpu.engines.distribute import surface
from estimator_tpu.engines.distribute import variables as tf1_variables
from estimator_tpu.engines.distribute import voice
from estimator_tpu.engines.distribute import workers as workers_lib

ModeKeys = stacks.ModeKeys
KEEP_CHECKPOINTS = tpu_estimator.KEEP_CHECKPOINTS
SAVE_AT_END = 2 ** 62  # save_checkpoints_steps of a run that checkpoints when train() ends
CHECKPOINT_NAME = "model.ckpt"


# params['context'] of an input_fn: TPUEstimator's TPUContext for the host of an InputContext.
HostContext = input_context_lib.for_input_fn
_BATCH_NAMES = {ModeKeys.TRAIN: "train_batch_size", ModeKeys.EVAL: "eval_batch_size",
                ModeKeys.PREDICT: "predict_batch_size"}


def _call_model_fn(model_fn, features, labels, mode, params, config, store):
  """The model_fn's spec; what a session-free engine cannot run is refused by name."""
  spec = calls.call_model_fn(model_fn, features, labels, mode, params, config)
  scaffold = getattr(spec, "scaffold", None)
  if getattr(spec, "scaffold_fn", None) is not None:
    # Called here, in a graph of the trace's own: its init_from_checkpoint and Saver are
    # recorded (tf1_variables.VariableStore); its session work is graph_twin's.
    scaffold = graph_twin.traced_scaffold(spec.scaffold_fn)
  graph_twin.check_scaffold(scaffold, mode, store)
  return spec


def _on_the_host_cpu(strategy):
  """A OneDeviceStrategy on a CPU: the input pipeline's own device."""
  if not isinstance(strategy, tf.distribute.OneDeviceStrategy):
    return False
  device, = strategy.extended.worker_devices
  return tf.DeviceSpec.from_string(device).device_type == "CPU"


def _features_and_labels(element):
  """A dataset element as TPUEstimator reads it: (features, labels), or features alone."""
  if isinstance(element, tuple) and len(element) == 2:
    return element
  return element, None


def _host_call_ops(host_call):
  """Runs a host_call (fn, tensors) here; the tensors are already the replicas' concatenated."""
  fn, tensors = host_call
  result = fn(**tensors) if isinstance(tensors, dict) else fn(*tensors)
  return [x for x in tf.nest.flatten(result) if isinstance(x, (tf.Tensor, tf.Operation))]


class DistributeEngine(surface.EstimatorSurface):
  """Runs a TPUEstimator model_fn and its input_fns in tf.functions under `strategy`.

  Args:
    model_fn: model_fn(features, labels, mode, params[, config]) returning a
      TPUEstimatorSpec (or an EstimatorSpec).
    params: the run's params (config.to_params() and class names).
    strategy: a tf.distribute strategy (the default one on one device).
    model_dir: where checkpoints and summaries go.
    train_batch_size, eval_batch_size, predict_batch_size: global batches.
    use_tpu: what params['use_tpu'] says to the model_fn (TPUStrategy).
    iterations_per_loop: training steps per call of the training function.
    save_checkpoints_steps: steps between checkpoints.
    jit_compile: compile each replica's step with XLA.
    replica_function: trace each replica's step in a tf.function of its own
      even without jit_compile, so step_graphs[mode] holds its ops only
      (preflight on a TensorFlow without XLA for the CPU).
    seed: the global random seed (RunConfig's tf_random_seed), or None.
    warm_start_from: a checkpoint whose trainable variables start a new run.
    export_estimator_fn: () -> the TPUEstimator (use_tpu=False) with the same
      model_fn, model_dir, config and params: it exports the SavedModel and
      answers for model_fn and config (surface.py); it is built here.
    run_config: what a model_fn with a `config` argument gets.
    keep_checkpoint_max: checkpoints kept.
    save_checkpoints_secs: also checkpoint when this long has passed since the
      last one (RunConfig's time-based saving), between loops.
  """

  def __init__(self, model_fn, params, strategy, model_dir, train_batch_size,
               eval_batch_size, predict_batch_size=None, use_tpu=False,
               iterations_per_loop=100, save_checkpoints_steps=100, jit_compile=False,
               seed=None, warm_start_from=None, export_estimator_fn=None,
               run_config=None,
               keep_checkpoint_max=KEEP_CHECKPOINTS, save_checkpoints_secs=None,
               replica_function=False):
    self._model_fn = model_fn
    self._user_params = copy.deepcopy(params)  # a dict, or an HParams (TPUEstimator takes both)
    self.strategy = strategy
    self._workers = workers_lib.Workers(strategy)  # the chief writes; stops are agreed
    self.model_dir = model_dir
    self._batches = {ModeKeys.TRAIN: train_batch_size, ModeKeys.EVAL: eval_batch_size,
                     ModeKeys.PREDICT: predict_batch_size or eval_batch_size}
    strategies.check_global_batches({"train_batch_size": train_batch_size,
                                     "eval_batch_size": eval_batch_size,
                                     "predict_batch_size": predict_batch_size}, strategy)
    self._use_tpu = use_tpu
    self._iterations = iterations_per_loop
    self._save_steps = save_checkpoints_steps
    self._jit = jit_compile
    self._replica_function = replica_function or jit_compile
    self._seed = seed
    self._warm_start_from = warm_start_from
    # Built now: its construction logs what TPUEstimator's does ("Using config: ...").
    self._tf_estimator = export_estimator_fn() if export_estimator_fn else None
    self._writers = summary_writers.TracedWriters(self._workers)  # a trace's summary writers
    self._metric_fn = None  # the eval_metrics' metric_fn, from the EVAL trace
    self._run_config = run_config
    self._keep = keep_checkpoint_max
    self._save_secs = save_checkpoints_secs
    self._store = tf1_variables.VariableStore()
    self._functions = {}
    self._traces = {}  # mode -> the last step_trace.StepTrace (the first replica's)
    self._locals = metric_ops.LocalVariables()
    # The graph each mode's replica step was last traced in (its model_fn ops).
    self.step_graphs = {}
    self._saver = None
    self._predictions = ([], True)  # the predictions' names, and whether a dict (traced)
    self._twin = None  # this train() call's graph_twin.GraphTwin
    self.host_loop_iterations = iterations_per_loop

  @property
  def num_replicas(self):
    return self.strategy.num_replicas_in_sync

  def describe(self):
    """'TPUStrategy, 8 replicas, jit_compile': what runs the model_fn."""
    parts = [strategies.strategy_name(self.strategy),
             f"{self.num_replicas} replica{'s' if self.num_replicas != 1 else ''}"]
    if self._jit:
      parts.append("jit_compile")
    return ", ".join(parts)

  # The pieces every mode shares.

  def _params(self, mode, input_context=None):
    """params for an input_fn (input_context given) or the model_fn, as TPUEstimator makes them.

    A copy of the program's params with the replica's share of the global
    batch, use_tpu, and TPUEstimator's TPUContext (engines/distribute/context.py):
    the host's for an input_fn; on a TPU, the model_fn's.
    """
    params = copy.deepcopy(self._user_params)
    share = inputs.replica_batch(self._batches[mode], self.num_replicas, _BATCH_NAMES[mode])
    items = {"batch_size": share, "use_tpu": self._use_tpu}
    if input_context is not None:
      hosts = input_context_lib.strategy_hosts(self.strategy, input_context.num_input_pipelines)
      items["context"] = input_context_lib.for_input_fn(input_context, mode, hosts)
    elif self._use_tpu:
      items["context"] = input_context_lib.for_model_fn(
          self.num_replicas, input_context_lib.strategy_hosts(self.strategy), mode)
    for key, value in items.items():
      if value is not None:
        tpu_estimator_lib._add_item_to_params(params, key, value)  # pylint: disable=protected-access
    return params

  def _dataset(self, input_fn, mode):
    """The input_fn's dataset distributed over the replicas, one input_fn call per host."""

    def dataset_fn(input_context):
      params, reads = workers_lib.watching_context(self._params(mode, input_context))
      with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
        dataset = inputs.host_dataset(input_fn, params, mode, self.config, input_context,
                                      self._seed)
      # Several input pipelines (workers, hosts): each its own share of the batches.
      return workers_lib.shard_unless_read(dataset, bool(reads), input_context)

    if self._seed is not None:
      tf.random.set_seed(self._seed)
    if _on_the_host_cpu(self.strategy):
      # One replica on the host's CPU: the batches are already where the step runs. The
      # strategy's distributed iterator (a MultiDeviceIterator prefetching to that CPU) made
      # every ResNet-50 step ~1.45x slower here (benchmarks/README.md). The same input
      # context as the strategy's: one pipeline, one replica.
      return dataset_fn(tf.distribute.InputContext())
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return self.strategy.distribute_datasets_from_function(dataset_fn, options)

  def _replica_spec(self, features, labels, mode, carry=None):
    """(the model_fn's spec for one replica, its variables from the store; what it carries).

    carry: None, or (leaves, source) to carry out for the hooks (step_trace.carried).
    """
    with step_trace.model_scope(), self._store.scope(), \
        self._optimizer_rules(), warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=".*layer.updates.*")
      # TF 1 summary ops traced in a function: their values reach hooks (SummarySaverHook).
      warnings.filterwarnings("ignore", message="Cannot activate TF2 compatibility support")
      tf.compat.v1.train.get_or_create_global_step()
      with self._writers.replica(step_trace.replica_id()):
        spec = _call_model_fn(self._model_fn, features, labels, mode, self._params(mode),
                              self.config, self._store)
      spec = eval_metrics.in_the_step_off_tpu(spec, mode, self._use_tpu)
      if step_trace.replica_id() == 0:
        self._traces[mode] = step_trace.StepTrace(tf.compat.v1.get_default_graph(), spec,
                                                  (features, labels))
      carried = step_trace.carried(*carry, self._store) if carry else {}
    self.step_graphs[mode] = tf.compat.v1.get_default_graph()
    return spec, carried

  def _optimizer_rules(self):
    """Around each replica's model_fn call: how TF 1 optimizers combine the replicas' gradients."""
    return optimizer_rules.applied(self.strategy)

  def _function(self, name, python_fn):
    """python_fn's tf.function, made once per name; traced with summary_writers' rules."""
    if name not in self._functions:
      @functools.wraps(python_fn)
      def traced(*args):
        with self._writers.tracing(name):
          return python_fn(*args)
      self._functions[name] = tf.function(traced, autograph=False)
      self._functions[name].writers_key = name
    return self._functions[name]

  def _replica_fn(self, fn):
    if not self._replica_function:
      return fn
    return tf.function(fn, autograph=False, jit_compile=self._jit)

  def _global_step(self):
    step = self._store.variables.get(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    return int(step.numpy()) if step is not None else 0

  # Checkpoints.

  def _checkpoint_saver(self):
    """A name-based Saver over each variable's first copy (the Saver takes no distributed ones).

    It keeps checkpoints as the Estimator's Saver does: keep_checkpoint_max
    of them, and one every keep_checkpoint_every_n_hours besides.
    """
    if self._saver is None:
      first_copies = {name: self.strategy.experimental_local_results(v)[0]
                      for name, v in self._store.global_variables().items()}
      hours = getattr(self.config, "keep_checkpoint_every_n_hours", None) or 10000.0
      with _quiet_tf_log():  # "Saver is deprecated": the names are the point here
        self._saver = tf.compat.v1.train.Saver(
            var_list=first_copies, max_to_keep=self._keep, save_relative_paths=True,
            keep_checkpoint_every_n_hours=hours)
      state = tf.train.get_checkpoint_state(self.model_dir)
      if state is not None:
        self._saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
    return self._saver

  def _restore(self, checkpoint_path=None, twin=None):
    """Restores the given or newest checkpoint; returns its path (None: fresh start).

    With `twin` (training), TF 1's session start is the twin's where it does more
    than restoring: a Scaffold's session work, tensor initial values (graph_twin.py).
    """
    path = checkpoint_path or tf.train.latest_checkpoint(self.model_dir)
    if path:
      voice.restoring(path)
      self._assign_from(path, self._store.global_variables())
      for var_list in self._store.savers:  # a scaffold's saver, e.g. moving averages
        self._assign_from(path, var_list)
      self._store.pending -= set(self._store.global_variables())
      if twin is not None and twin.wanted_at_resume(self._store):
        twin.start(self._store, self.strategy, path)
      return path
    if twin is not None and twin.wanted_at_start(self._store):
      twin.start(self._store, self.strategy)
      # Each worker's twin drew its own unseeded values (Keras' per-process seeds): the
      # chief's are every worker's, as the strategy's own initial values are.
      self._workers.share_chiefs_values(self._store.global_variables())
      return None
    if self._warm_start_from:
      self._warm_start()
    for name, (variable, ckpt_file, tensor_name) in self._store.checkpoint_initializers.items():
      del name
      with self.strategy.scope():
        variable.assign(tf.train.load_variable(ckpt_file, tensor_name))
    return None

  def _assign_from(self, path, variables):
    """Assigns each variable its value in the checkpoint at path (every replica's copy)."""
    reader = tf.train.load_checkpoint(path)
    stored = reader.get_variable_to_shape_map()
    missing = sorted(set(variables) - set(stored))
    if missing:
      raise ValueError(
          f"checkpoint {path} lacks {len(missing)} variable(s) of this model_fn, e.g. "
          f"{missing[0]!r}; it holds e.g. {sorted(stored)[:3]}")
    with self.strategy.scope():
      for name, variable in variables.items():
        variable.assign(reader.get_tensor(name))

  def _warm_start(self):
    """Trainable variables from --warm_start_from, by name (the Estimator's default)."""
    path = self._warm_start_from
    if tf.io.gfile.isdir(path):
      path = tf.train.latest_checkpoint(path)
    names = set(dict(tf.train.list_variables(path)))
    self._assign_from(path, {name: v for name, v in self._store.global_variables().items()
                             if v.trainable and name in names})


  def _sync_on_read_to_copies(self):
    """Each replica-local variable (batch-norm statistics) takes its aggregate in every copy.

    Over every replica of every worker (each worker reads the aggregate, together), so the
    chief saves the statistics of all the workers' batches, as one device would have them.
    """
    with self.strategy.scope():
      for variable in self._store.global_variables().values():
        if getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ and (
            len(self.strategy.experimental_local_results(variable)) > 1 or self._workers.many):
          variable.assign(variable.read_value())

  def _save(self, listeners):
    """Saves model.ckpt-STEP as CheckpointSaverHook does; returns whether a listener said stop."""
    step = self._global_step()
    voice.before_save(step)
    for listener in listeners:
      listener.before_save(None, step)
    self._workers.barrier()  # all workers have restored, or all have trained to step
    self._sync_on_read_to_copies()
    save_path = os.path.join(self.model_dir, CHECKPOINT_NAME)
    if self._workers.is_chief:
      tf.io.gfile.makedirs(self.model_dir)
      voice.saving(step, save_path)
      path = self._checkpoint_saver().save(None, save_path, global_step=step,
                                           write_meta_graph=False)
      if self._twin is not None:  # the .meta beside it, as the Estimator's Saver writes one
        self._twin.after_save(path)
      event_files.checkpoint_saved(self.model_dir, save_path, step)
    self._workers.barrier()  # the chief's checkpoint is there for every worker
    voice.after_save(step)
    stop = False
    for listener in listeners:
      if listener.after_save(None, step):
        voice.listener_stopped(listener)
        stop = True
    return stop

  # Training.

  def _train_function(self, carry=None):
    """The training loop's tf.function: (loss, {key: [steps, ...] carried for the hooks})."""
    leaves = carry[0] if carry else {}

    def step_fn(features, labels):
      spec, carried = self._replica_spec(features, labels, ModeKeys.TRAIN, carry)
      if spec.train_op is None or spec.loss is None:
        raise ValueError("the model_fn returned no train_op or no loss in TRAIN mode")
      host_call = getattr(spec, "host_call", None)
      with tf.control_dependencies([spec.train_op]):
        loss = tf.identity(spec.loss)
      # Concatenated over replicas on the host, as TPUEstimator's outfeed does.
      host_tensors = tf.nest.map_structure(
          lambda t: tf.reshape(t, [1]) if t.shape.rank == 0 else t,
          host_call[1] if host_call else [])
      return loss, host_tensors, host_call, carried

    def train_loop(iterator, steps):
      def body(i, unused_loss, arrays):
        features, labels = _features_and_labels(iterator.get_next())
        with self._store.replicas(), self._store.outside():
          results = {}

          def replica(features, labels):
            loss, host_tensors, host_call, carried = step_fn(features, labels)
            results["host_call"] = host_call
            return loss, host_tensors, carried

          loss, host_tensors, carried = self.strategy.run(self._replica_fn(replica),
                                                          args=(features, labels))
        loss = self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
        host_call = results["host_call"]
        writes = []
        if host_call is not None:
          writes = self._run_host_call(host_call[0], host_tensors)
        arrays = {key: array.write(i, self.strategy.experimental_local_results(carried[key])[0])
                  for key, array in arrays.items()}
        with tf.control_dependencies(writes):
          return i + 1, tf.identity(loss), arrays

      arrays = {key: step_trace.steps_array(leaf, steps) for key, leaf in leaves.items()}
      _, loss, arrays = tf.while_loop(lambda i, *_: i < steps, body,
                                      [tf.constant(0), tf.constant(0.0), arrays],
                                      parallel_iterations=1)
      return loss, {key: array.stack() for key, array in arrays.items()}

    return self._function(step_trace.function_name("train", carry), train_loop)

  def _step_function(self, mode, make, args, carry=None, fresh=False):
    """(mode's step function carrying carry for the hooks, the StepTrace of its trace).

    Traced here, once per set of carried keys. fresh (a train(), evaluate()
    or predict() call begins): a model_fn that returned hooks is traced again,
    as the Estimator calls it again for each call and its hooks are new.
    """
    function = make(carry)
    known = getattr(function, "step_trace", None)
    if fresh and known is not None and distribute_hooks.model_fn_hooks(known.spec, mode):
      self._functions = {name: f for name, f in self._functions.items() if f is not function}
      function = make(carry)
    if getattr(function, "step_trace", None) is None:
      function.get_concrete_function(*args)
      function.step_trace = self._traces[mode]
      self._locals.snapshot(self._store, self.strategy)
    if not fresh:  # it runs next: its summary files are made
      self._writers.ready(function.writers_key)
    return function, function.step_trace

  def _hook_runner(self, mode, hooks, trace, iterator, original_fetches):
    """(HookRunner of one call, SavingPlan of its checkpoint savers and profilers): hooks.py."""
    return distribute_hooks.runner_for(
        mode, hooks, trace, self._store, self.strategy, iterator, self.model_dir,
        original_fetches)

  def _run_host_call(self, fn, tensors):
    """host_call fn on the host, over the replicas' tensors concatenated on axis 0."""
    joined = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), tensors)
    # Summary tags take the name scope: the host_call's start at the top, as on the host.
    with tf.compat.v1.get_default_graph().name_scope(None), self._store.scope():
      return _host_call_ops((fn, joined))

  def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
    """Trains to max_steps (or for steps more); checkpoints every save_checkpoints_steps.

    As the estimator's train(): nothing runs when the newest checkpoint is at
    max_steps already; the run ends early when the input_fn's data does.

    Returns:
      self.
    """
    with voice.loop_of("training_loop"):
      surface.check_train_steps(steps, max_steps)
      if surface.max_steps_reached(self.model_dir, max_steps):
        voice.skipping_training()
        return self
      try:
        with self.strategy.scope(), self._writers.call():
          loss = self._train(input_fn, hooks, steps, max_steps, saving_listeners)
      finally:
        self._twin = None  # a graph twin serves one train() call
      voice.loss_for_final_step(loss)
    return self

  def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
    """The training loop; returns the last step's loss (np.float32), None if no step ran.

    Each call of the training function is followed, as each session.run of
    the Estimator is, by the CheckpointSaverHook's save (when its timer says)
    and the SummarySaverHook's `loss`, then the hooks' after_run for each of
    its steps (the program's, the Estimator's NanTensorHook, the model_fn's),
    then TPUEstimator's step rate and loss lines (monitors.py).
    """
    random_state = graph_twin.RandomState.now()  # what the Estimator's build of this call draws
    iterator = iter(self._dataset(input_fn, ModeKeys.TRAIN))
    args = (iterator, tf.TensorSpec([], tf.int32))
    traced = self.step_graphs.get(ModeKeys.TRAIN)
    with voice.calling_model_fn(ModeKeys.TRAIN, self._use_tpu):
      _, trace = self._step_function(ModeKeys.TRAIN, self._train_function, args,
                                     fresh=True)  # makes the variables
    self._twin = self._graph_twin(input_fn, self.step_graphs.get(ModeKeys.TRAIN) is traced,
                                  random_state=random_state)
    runner, plan = self._hook_runner(ModeKeys.TRAIN, hooks or [], trace, iterator,
                                     [trace.spec.train_op, trace.spec.loss])
    saving = checkpoint_timing.CheckpointTiming(
        self._save, [*(saving_listeners or []), *plan.listeners],
        min(self._save_steps, plan.every_steps or self._save_steps),
        min(x for x in (self._save_secs, plan.every_secs, float("inf")) if x))
    if not (plan.every_steps or plan.every_secs):  # no program's CheckpointSaverHook
      voice.create_checkpoint_saver()
    saving.begin()
    runner.begin()
    with voice.session_creation():
      # Local variables from their initial values, then the twin's local_init_op sets its own.
      self._locals.reset(self._store, self.strategy)
      self._restore(twin=self._twin)
    step = self._global_step()
    last = max_steps if max_steps is not None else (
        step + steps if steps is not None else float("inf"))
    if step >= last:
      return None
    # A signal some worker got before this call: every worker stops in begin().
    stop = self._workers.agree_to_stop(False, hooks or [])
    saving.start(step)  # CheckpointSaverHook saves the step a run starts from
    runner.after_create_session(step)
    if self._workers.is_chief:  # graph.pbtxt, as the chief's CheckpointSaverHook writes it
      self._twin.after_create_session()
    watch = monitors.TrainingMonitors(self._events_dir(self.model_dir), self._tf_estimator,
                                      self._batches[ModeKeys.TRAIN], self._use_tpu)
    state = {"loss": None}
    while step < last and not stop:
      profiled = plan.profiling.due(step) if plan.profiling else []
      count = 1 if profiled else int(min(
          self._iterations, last - step, saving.until_due(step), runner.until_cut(step),
          plan.profiling.until_due(step) if plan.profiling else float("inf")))

      def run(leaves, count=count, step=step, profiled=profiled):
        carry = (leaves, trace) if leaves else None
        function = self._step_function(ModeKeys.TRAIN, self._train_function, args, carry)[0]
        call = lambda: function(iterator, tf.constant(count))  # noqa: E731
        loss, arrays = plan.profiling.profile(profiled, step, call) if profiled else call()
        self._check_stepped(step, count)
        state["loss"] = loss.numpy()
        state["stop"] = saving.after_steps(step + count)
        watch.summaries(step + count, state["loss"])
        return {key: array.numpy() for key, array in arrays.items()}

      try:
        stop = runner.run(step, count, run)
      except tf.errors.OutOfRangeError:  # the input_fn's data ended: so does the run
        step = self._global_step()
        break
      step = self._global_step()
      stop = state["stop"] or stop
      stop = self._workers.agree_to_stop(stop, hooks or [])
      watch.after_loop(step, state["loss"])
    saving.end(step)
    runner.end(step)
    watch.end()
    if state["loss"] is None:
      voice.no_steps()
    return state["loss"]

  def _session_restored(self, runner, path):
    """An evaluate() or predict() session's start, as MonitoredSession's; returns the global step.

    The hooks' begin, the session (local variables from their initial values,
    the checkpoint at path restored), then their after_create_session.
    """
    runner.begin()
    with voice.session_creation():
      self._locals.reset(self._store, self.strategy)
      with self.strategy.scope():
        self._restore(path)
    step = self._global_step()
    runner.after_create_session(step)
    return step

  def _check_stepped(self, step, count):
    new_step = self._global_step()
    if new_step != step + count:
      raise ValueError(
          f"the global step went from {step} to {new_step} in {count} training steps: the "
          "model_fn's train_op must add 1 to the global step per step (minimize(loss, "
          "global_step=tf.compat.v1.train.get_or_create_global_step()))")

  def _graph_twin(self, input_fn, show_program_output, mode=ModeKeys.TRAIN, hooks=(),
                  random_state=None):
    """The model_fn of mode in a TF 1 graph, built when something asks for it (graph_twin.py)."""
    input_context = tf.distribute.InputContext(1, 0, self.num_replicas)
    return graph_twin.GraphTwin(
        self._model_fn, input_fn, lambda: self._params(mode),
        lambda: self._params(mode, input_context), self.config, self._seed, self.model_dir,
        self._warm_start_from, self._keep, show_program_output, mode, hooks, random_state)

  def run_one_step(self, input_fn, mode):
    """Runs the function train() (TRAIN) or evaluate() (EVAL) runs, once, on one batch.

    The same tf.function, traced and called as those methods do (with
    jit_compile, XLA compiles each replica's step), from the variables'
    initial values: no checkpoint is read or written, no hook runs, the
    engine writes no summaries (a host_call writes where params['model_dir']
    says). train.py --preflight compiles the engine's program with it.

    Args:
      input_fn: the input_fn of mode.
      mode: ModeKeys.TRAIN or ModeKeys.EVAL.

    Returns:
      The step's loss (the mean over replicas), a float; the replica step's
      graph is then step_graphs[mode].

    Raises:
      tf.errors.OpError: the step did not compile or run (e.g. an op XLA
        cannot compile); other errors: the model_fn failed while traced.
    """
    with self.strategy.scope(), self._writers.call():
      iterator = iter(self._dataset(input_fn, mode))
      if mode == ModeKeys.TRAIN:
        function = self._train_function()
        function.get_concrete_function(iterator, tf.TensorSpec([], tf.int32))
        self._writers.ready(function.writers_key)
        return float(function(iterator, tf.constant(1))[0])
      if mode == ModeKeys.EVAL:
        function = self._eval_function()
        function.get_concrete_function(iterator)
        self._writers.ready(function.writers_key)
        return float(function(iterator)[0])
    raise ValueError(f"run_one_step runs TRAIN or EVAL, not {mode!r}")

  # Evaluation.

  def _eval_function(self, carry=None):
    """One evaluation step's tf.function: (loss, metric_fn tensors, {key: [1, ...]} carried)."""
    def eval_step(iterator):
      features, labels = _features_and_labels(iterator.get_next())
      results = {}

      def replica(features, labels):
        spec, carried = self._replica_spec(features, labels, ModeKeys.EVAL, carry)
        metrics = getattr(spec, "eval_metrics", None)
        if metric_ops.value_tensors(spec) and self._use_tpu:
          raise ValueError("the model_fn returned eval_metric_ops, which TPUEstimator takes "
                           "only off TPU; on a TPU give eval_metrics=(metric_fn, tensors)")
        results["metric_fn"] = metrics[0] if metrics else None
        loss, examples = replica_loss.weighted(spec.loss, features, labels)
        return loss, examples, (metrics[1] if metrics else []), carried

      with self._store.replicas(), self._store.outside():
        loss, examples, tensors, carried = self.strategy.run(self._replica_fn(replica),
                                                             args=(features, labels))
      loss = replica_loss.combined(self.strategy, loss, examples)
      tensors = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), tensors)
      self._metric_fn = results["metric_fn"]
      return loss, tensors, step_trace.first_replica_steps(self.strategy, carried)

    return self._function(step_trace.function_name("eval", carry), eval_step)

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
    """One pass (or `steps` batches): the estimator's dict, written to eval_dir(name).

    Returns:
      {metric: NumPy value (eval_metrics' metric_fn or an EstimatorSpec's
      eval_metric_ops), 'loss': np.float32 (the mean of the batches'),
      'global_step': np.int64}, as the estimator's evaluate() returns.
    """
    with voice.loop_of("evaluation_loop"):
      surface.check_eval_steps(steps)
      with self._writers.call():
        return self._evaluate(input_fn, steps, hooks, checkpoint_path, name)

  def _evaluate(self, input_fn, steps, hooks, checkpoint_path, name):
    path = checkpoint_path or self.latest_checkpoint()
    if not path:
      voice.no_trained_model(self.model_dir, "evaluate")
    with self.strategy.scope():
      iterator = iter(self._dataset(input_fn, ModeKeys.EVAL))
      with voice.calling_model_fn(ModeKeys.EVAL, self._use_tpu):
        function, trace = self._step_function(ModeKeys.EVAL, self._eval_function, (iterator,),
                                       fresh=True)
      # The traced shapes: a batch dimension the input leaves open stays open for the metric_fn.
      traced = function.get_concrete_function(iterator).structured_outputs[1]
    updates = [pair[1] for pair in (getattr(trace.spec, "eval_metric_ops", None) or {}).values()]
    # The estimator's hook of evaluate(steps=N) comes right after the hooks given.
    runner = self._hook_runner(ModeKeys.EVAL, [*(hooks or []), *voice.evaluation_steps(steps)],
                               trace, iterator, updates or None)[0]
    started = voice.starting_evaluation()
    step = self._session_restored(runner, path)
    metrics, loss = None, surface.MeanLoss()

    def run(leaves):
      nonlocal metrics
      carry = (leaves, trace) if leaves else None
      function = self._step_function(ModeKeys.EVAL, self._eval_function, (iterator,), carry)[0]
      with self.strategy.scope():
        batch_loss, tensors, carried = function(iterator)
      # The metric_fn runs on the host, outside the strategy, as TPUEstimator's does.
      if metrics is None:
        metrics = _HostMetrics(self._metric_fn, tensors, traced)
      metrics.update(tensors)
      loss.add(batch_loss.numpy())
      self._workers.agree_to_stop(False, hooks or [])  # a signal stops every worker's pass
      return {key: value.numpy() for key, value in carried.items()}

    stop = False
    while not stop:  # evaluate(steps=N)'s hook stops it after N
      try:
        stop = runner.run(step, 1, run)
      except tf.errors.OutOfRangeError:
        break
    runner.end(step)
    values = {**(metrics.values() if metrics else {}), **metric_ops.final_values(trace)}
    voice.finished_evaluation(started)
    results = surface.evaluation_results(values, loss.value(), step)
    event_files.evaluation(self._events_dir(self.eval_dir(name)), results, path)
    return results

  # Prediction and export.

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True):
    """Yields the model_fn's predictions as the estimator does: per example (or batch), NumPy."""
    with voice.loop_of("prediction_loop"), self._writers.call():
      yield from self._predict(input_fn, predict_keys, hooks, checkpoint_path,
                               yield_single_examples)
    voice.info("%s marked as finished", "prediction_loop")  # TPUEstimator says it twice

  def _predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples):
    path = checkpoint_path or self.latest_checkpoint()
    if not path:
      voice.no_trained_model(self.model_dir, "predict")
    with self.strategy.scope():
      iterator = iter(self._dataset(input_fn, ModeKeys.PREDICT))
      with voice.calling_model_fn(ModeKeys.PREDICT, self._use_tpu):
        _, trace = self._step_function(ModeKeys.PREDICT, self._predict_function, (iterator,),
                                       fresh=True)
    names, are_dict = self._predictions
    names = surface.check_predict_keys(names, are_dict, predict_keys)
    runner = self._hook_runner(
        ModeKeys.PREDICT, hooks or [], trace, iterator,
        {name: trace.spec.predictions[name] for name in names} if are_dict and predict_keys
        else trace.spec.predictions)[0]  # what the estimator's session.run fetches
    step = self._session_restored(runner, path)
    batch = {}

    def run(leaves):
      carry = (leaves, trace) if leaves else None
      function = self._step_function(ModeKeys.PREDICT, self._predict_function, (iterator,),
                                     carry)[0]
      with self.strategy.scope():
        predictions, carried = function(iterator)
      batch.update({name: predictions[name].numpy() for name in names})
      return {key: value.numpy() for key, value in carried.items()}

    stop = False
    while not stop:
      batch.clear()
      try:
        stop = runner.run(step, 1, run)
      except tf.errors.OutOfRangeError:
        break
      yield from surface.examples(dict(batch), are_dict, yield_single_examples)
    runner.end(step)

  def _predict_function(self, carry=None):
    """One prediction step's tf.function: (predictions, {key: [1, ...]} carried)."""
    def predict_step(iterator):
      features, _ = _features_and_labels(iterator.get_next())

      def replica(features):
        spec, carried = self._replica_spec(features, None, ModeKeys.PREDICT, carry)
        predictions = spec.predictions
        are_dict = isinstance(predictions, dict)
        if not are_dict:
          predictions = {"predictions": predictions}
        self._predictions = (list(predictions), are_dict)  # names, and whether a dict
        return predictions, carried

      with self._store.replicas(), self._store.outside():
        predictions, carried = self.strategy.run(replica, args=(features,))
      return ({k: self.strategy.gather(v, axis=0) for k, v in predictions.items()},
              step_trace.first_replica_steps(self.strategy, carried))

    return self._function(step_trace.function_name("predict", carry), predict_step)

  def _export_base(self, export_dir_base):
    """export_dir_base on the chief; elsewhere a scratch directory (the chief's is the run's)."""
    return export_dir_base if self._workers.is_chief else self._workers.scratch_dir("export")

  def _events_dir(self, directory):
    """directory on the chief; elsewhere a scratch directory (only the chief writes summaries)."""
    return directory if self._workers.is_chief else self._workers.scratch_dir("events")


@contextlib.contextmanager
def _quiet_tf_log():
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")
  try:
    yield
  finally:
    logger.setLevel(level)


class _HostMetrics:
  """An eval_metrics metric_fn on the host: its TF 1 metrics in a graph of their own.

  tf.compat.v1.wrap_function keeps TF 1's rule that only what is fetched runs:
  one pruned function updates the metrics with a batch, another reads them.
  Their variables start at zero for each evaluation.
  """

  def __init__(self, metric_fn, example_tensors, traced_tensors=None):
    self._structure = example_tensors
    if metric_fn is None:
      self._update = None
      return
    flat = tf.nest.flatten(example_tensors)
    shaped = flat if traced_tensors is None else tf.nest.flatten(traced_tensors)
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in shaped]
    captured = {}

    def build(*flat_tensors):
      tensors = tf.nest.pack_sequence_as(self._structure, list(flat_tensors))
      metrics = eval_metrics.call_metric_fn(metric_fn, tensors)
      for name, (value, update) in metrics.items():
        captured[name] = (tf.identity(value), tf.group(update))
      return {}

    wrapped = tf.compat.v1.wrap_function(build, specs)
    self._names = sorted(captured)
    graph = wrapped.graph
    updates = [graph.as_graph_element(captured[n][1]) for n in self._names]
    values = [graph.as_graph_element(captured[n][0]) for n in self._names]
    self._update = wrapped.prune(feeds=wrapped.inputs, fetches=updates)
    self._read = wrapped.prune(feeds=[], fetches=values)

  def update(self, tensors):
    if self._update is not None:
      self._update(*tf.nest.flatten(tensors))

  def values(self):
    if self._update is None:
      return {}
    return {name: value.numpy() for name, value in zip(self._names, self._read())}

