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
  exported by the estimator from the same checkpoint (export/saved_model.py).

The engine presents train / evaluate / predict / export_saved_model as the
estimators of tpu_estimator.py do, so loop.py does not know which it drives.
SessionRunHooks run at the loop's edges (begin, before_run/after_run once
per loop, end); a hook that asks to fetch graph tensors is refused with its
name (distribute_hooks.py).
"""

import contextlib
import os
import time
import warnings

import tensorflow as tf
from tensorflow.python.ops import summary_ops_v2

from estimator_tpu import stacks
from estimator_tpu.engines import calls
from estimator_tpu.engines import strategies
from estimator_tpu.engines import tpu_estimator
from estimator_tpu.engines.distribute import hooks as distribute_hooks
from estimator_tpu.engines.distribute import optimizer_rules
from estimator_tpu.engines.distribute import replica_loss
from estimator_tpu.engines.distribute import variables as tf1_variables
from estimator_tpu.engines.distribute import workers as workers_lib

ModeKeys = stacks.ModeKeys
KEEP_CHECKPOINTS = tpu_estimator.KEEP_CHECKPOINTS
SAVE_AT_END = 2 ** 62  # save_checkpoints_steps of a run that checkpoints when train() ends
CHECKPOINT_NAME = "model.ckpt"
EVAL_DIR = "eval"


class HostContext:
  """params['context'] of an input_fn: which host of how many (TPUEstimator's PER_HOST_V2)."""

  def __init__(self, input_context):
    self.num_hosts = input_context.num_input_pipelines if input_context else 1
    self.current_host = input_context.input_pipeline_id if input_context else 0
    self.num_replicas = input_context.num_replicas_in_sync if input_context else 1


def _call_model_fn(model_fn, features, labels, mode, params, config):
  """The model_fn's spec; what a session-free engine cannot run is refused by name."""
  spec = calls.call_model_fn(model_fn, features, labels, mode, params, config)
  scaffold = getattr(spec, "scaffold", None)
  if getattr(spec, "scaffold_fn", None) is not None:
    # Called here, in the trace: its init_from_checkpoint and Saver are recorded
    # (tf1_variables.VariableStore) and done by the engine.
    scaffold = spec.scaffold_fn()
  _check_scaffold(scaffold)
  for kind in ("training_hooks", "evaluation_hooks", "prediction_hooks"):
    hooks = getattr(spec, kind, None) or ()
    if hooks:
      raise distribute_hooks.refusal(hooks[0], f"is one of the model_fn's {kind} (they fetch "
                                                "the tensors of the graph being built)")
  return spec


def _features_and_labels(element):
  """A dataset element as TPUEstimator reads it: (features, labels), or features alone."""
  if isinstance(element, tuple) and len(element) == 2:
    return element
  return element, None


def _check_scaffold(scaffold):
  """A Scaffold whose work needs a session is refused, naming what it holds."""
  if scaffold is None:
    return
  needs_session = [name for name in ("init_op", "init_fn", "init_feed_dict", "local_init_op",
                                     "ready_op", "ready_for_local_init_op")
                   if getattr(scaffold, "_" + name, None) is not None]
  if needs_session:
    raise distribute_hooks.UnsupportedHookError(
        f"the model_fn's Scaffold sets {', '.join(needs_session)}, which need a TF 1 "
        "session; --engine=distribute runs none (its init_from_checkpoint and its saver are "
        "supported): use --engine=estimator / ESTIMATOR_TPU_ENGINE=estimator")


def _host_call_ops(host_call):
  """Runs a host_call (fn, tensors) here; the tensors are already the replicas' concatenated."""
  fn, tensors = host_call
  result = fn(**tensors) if isinstance(tensors, dict) else fn(*tensors)
  return [x for x in tf.nest.flatten(result) if isinstance(x, (tf.Tensor, tf.Operation))]


class DistributeEngine:
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
    export_estimator_fn: () -> the estimator that exports the SavedModel.
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
    self.params = dict(params)
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
    self._export_estimator_fn = export_estimator_fn
    self._writers = {}  # summary writers of the engine's own summaries, by directory
    self._kept_writers = []  # writers a traced host_call made (see _keeping_writers)
    self._metric_fn = None  # the eval_metrics' metric_fn, from the EVAL trace
    self.config = run_config
    self._keep = keep_checkpoint_max
    self._save_secs = save_checkpoints_secs
    self._store = tf1_variables.VariableStore()
    self._functions = {}
    # The graph each mode's replica step was last traced in (its model_fn ops).
    self.step_graphs = {}
    self._saver = None
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
    params = dict(self.params, batch_size=self._batches[mode] // self.num_replicas,
                  use_tpu=self._use_tpu)
    if input_context is not None:
      params["context"] = HostContext(input_context)
    return params

  def _dataset(self, input_fn, mode):
    """The input_fn's dataset distributed over the replicas, one input_fn call per host."""

    def dataset_fn(input_context):
      params, reads = workers_lib.watching_context(self._params(mode, input_context))
      with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data")
        dataset = input_fn(params)
      # Several input pipelines (workers, hosts): each its own share of the batches.
      dataset = workers_lib.shard_unless_read(dataset, bool(reads), input_context)
      if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            f"the input_fn returned a {type(dataset).__name__}; --engine=distribute needs a "
            "tf.data.Dataset of (features, labels) batches of params['batch_size']")
      return dataset

    if self._seed is not None:
      tf.random.set_seed(self._seed)
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return self.strategy.distribute_datasets_from_function(dataset_fn, options)

  @contextlib.contextmanager
  def _keeping_writers(self):
    """Summary writers a traced host_call creates live as long as the engine.

    tf.summary.create_file_writer inside a tf.function makes its writer
    outside it, and the writer's resource goes when the Python object does:
    the engine keeps each one, as the estimator's graph kept its writers.
    """
    kept = self._kept_writers
    # tf.summary's writer and tf.contrib.summary's (TF 1.15's) one.
    classes = [getattr(summary_ops_v2, name) for name in
               ("_ResourceSummaryWriter", "_LegacyResourceSummaryWriter")
               if hasattr(summary_ops_v2, name)]
    originals = {cls: cls.__dict__["__init__"] for cls in classes}

    def keeping(original):
      def init(writer, *args, **kwargs):
        original(writer, *args, **kwargs)
        kept.append(writer)
      return init

    for cls, original in originals.items():
      cls.__init__ = keeping(original)
    try:
      yield
    finally:
      for cls, original in originals.items():
        cls.__init__ = original

  def _replica_spec(self, features, labels, mode):
    """The model_fn's spec for one replica, its variables from the store."""
    with self._store.scope(), optimizer_rules.applied(self.strategy), \
        warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=".*layer.updates.*")
      tf.compat.v1.train.get_or_create_global_step()
      spec = _call_model_fn(self._model_fn, features, labels, mode, self._params(mode),
                            self.config)
    self.step_graphs[mode] = tf.compat.v1.get_default_graph()
    return spec

  def _function(self, name, python_fn):
    if name not in self._functions:
      self._functions[name] = tf.function(python_fn, autograph=False)
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
    """A name-based Saver over each variable's first copy (the Saver takes no distributed ones)."""
    if self._saver is None:
      first_copies = {name: self.strategy.experimental_local_results(v)[0]
                      for name, v in self._store.global_variables().items()}
      with _quiet_tf_log():  # "Saver is deprecated": the names are the point here
        self._saver = tf.compat.v1.train.Saver(
            var_list=first_copies, max_to_keep=self._keep, save_relative_paths=True)
      state = tf.train.get_checkpoint_state(self.model_dir)
      if state is not None:
        self._saver.recover_last_checkpoints(list(state.all_model_checkpoint_paths))
    return self._saver

  def _restore(self, checkpoint_path=None):
    """Restores the given or newest checkpoint; returns its path (None: fresh start)."""
    path = checkpoint_path or tf.train.latest_checkpoint(self.model_dir)
    if path:
      self._assign_from(path, self._store.global_variables())
      for var_list in self._store.savers:  # a scaffold's saver, e.g. moving averages
        self._assign_from(path, var_list)
      return path
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
    """Each replica-local variable (batch-norm statistics) takes its aggregate in every copy."""
    with self.strategy.scope():
      for variable in self._store.global_variables().values():
        if getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ and (
            len(self.strategy.experimental_local_results(variable)) > 1):
          variable.assign(variable.read_value())

  def _save(self, listeners):
    step = self._global_step()
    for listener in listeners:
      listener.before_save(None, step)
    self._workers.barrier()  # all workers have restored, or all have trained to step
    self._sync_on_read_to_copies()
    if self._workers.is_chief:
      tf.io.gfile.makedirs(self.model_dir)
      self._checkpoint_saver().save(None, os.path.join(self.model_dir, CHECKPOINT_NAME),
                                    global_step=step, write_meta_graph=False)
    self._workers.barrier()  # the chief's checkpoint is there for every worker
    stop = False
    for listener in listeners:
      stop = bool(listener.after_save(None, step)) or stop
    return stop

  # Training.

  def _train_function(self):
    def step_fn(features, labels):
      spec = self._replica_spec(features, labels, ModeKeys.TRAIN)
      if spec.train_op is None or spec.loss is None:
        raise ValueError("the model_fn returned no train_op or no loss in TRAIN mode")
      host_call = getattr(spec, "host_call", None)
      with tf.control_dependencies([spec.train_op]):
        loss = tf.identity(spec.loss)
      # Concatenated over replicas on the host, as TPUEstimator's outfeed does.
      host_tensors = tf.nest.map_structure(
          lambda t: tf.reshape(t, [1]) if t.shape.rank == 0 else t,
          host_call[1] if host_call else [])
      return loss, host_tensors, host_call

    def train_loop(iterator, steps):
      def body(i, unused_loss):
        features, labels = _features_and_labels(iterator.get_next())
        with self._store.replicas(), self._store.outside():
          results = {}

          def replica(features, labels):
            loss, host_tensors, host_call = step_fn(features, labels)
            results["host_call"] = host_call
            return loss, host_tensors

          loss, host_tensors = self.strategy.run(self._replica_fn(replica),
                                                 args=(features, labels))
        loss = self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)
        host_call = results["host_call"]
        writes = []
        if host_call is not None:
          writes = self._run_host_call(host_call[0], host_tensors)
        with tf.control_dependencies(writes):
          return i + 1, tf.identity(loss)

      _, loss = tf.while_loop(lambda i, _: i < steps, body,
                              [tf.constant(0), tf.constant(0.0)], parallel_iterations=1)
      return loss

    return self._function("train", train_loop)

  def _run_host_call(self, fn, tensors):
    """host_call fn on the host, over the replicas' tensors concatenated on axis 0."""
    joined = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), tensors)
    # Summary tags take the name scope: the host_call's start at the top, as on the host.
    with tf.compat.v1.get_default_graph().name_scope(None), self._store.scope(), \
        self._keeping_writers(), self._workers.summaries_aside():
      return _host_call_ops((fn, joined))

  def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
    """Trains to max_steps (or for steps more); checkpoints every save_checkpoints_steps."""
    if steps is not None and max_steps is not None:
      raise ValueError("give steps or max_steps, not both")
    with self.strategy.scope():
      return self._train(input_fn, hooks, steps, max_steps, saving_listeners)

  def _train(self, input_fn, hooks, steps, max_steps, saving_listeners):
    hooks, plan = distribute_hooks.take_over(hooks or [], self.model_dir)
    listeners = [*(saving_listeners or []), *plan.listeners]
    save_steps = min(self._save_steps, plan.every_steps or self._save_steps)
    save_secs = min(x for x in (self._save_secs, plan.every_secs, float("inf")) if x)
    runner = distribute_hooks.HookRunner(hooks, ModeKeys.TRAIN)
    iterator = iter(self._dataset(input_fn, ModeKeys.TRAIN))
    function = self._train_function()
    function.get_concrete_function(iterator, tf.TensorSpec([], tf.int32))  # makes the variables
    fresh = self._restore() is None
    step = self._global_step()
    last = max_steps if max_steps is not None else (
        step + steps if steps is not None else float("inf"))
    if step >= last:
      return self
    for listener in listeners:
      listener.begin()
    # A signal some worker got before this call: every worker stops in begin().
    stop = self._workers.agree_to_stop(False, hooks)
    runner.begin()
    runner.after_create_session()
    if fresh:  # as the Estimator's saver does when a run starts from nothing
      self._save(listeners)
    saved_at, saved_time = step, time.time()
    while step < last and not stop:
      until_save = save_steps - step % save_steps
      count = int(min(self._iterations, last - step, until_save))
      runner.before_run()
      began = time.time()
      loss = float(function(iterator, tf.constant(count)))
      seconds = time.time() - began
      new_step = self._global_step()
      if new_step != step + count:
        raise ValueError(
            f"the global step went from {step} to {new_step} in {count} training steps: the "
            "model_fn's train_op must add 1 to the global step per step (minimize(loss, "
            "global_step=tf.compat.v1.train.get_or_create_global_step()))")
      step = new_step
      self._write_train_summaries(step, loss, count / max(seconds, 1e-9))
      if step % save_steps == 0 or time.time() - saved_time >= save_secs:
        stop = self._save(listeners)
        saved_at, saved_time = step, time.time()
      stop = runner.after_run(step) or stop
      stop = self._workers.agree_to_stop(stop, hooks)
    if saved_at != step:
      self._save(listeners)
    for listener in listeners:
      listener.end(None, step)
    runner.end()
    return self

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
    with self.strategy.scope():
      iterator = iter(self._dataset(input_fn, mode))
      if mode == ModeKeys.TRAIN:
        return float(self._train_function()(iterator, tf.constant(1)))
      if mode == ModeKeys.EVAL:
        loss, _ = self._eval_function()(iterator)
        return float(loss)
    raise ValueError(f"run_one_step runs TRAIN or EVAL, not {mode!r}")

  def _write_train_summaries(self, step, loss, steps_per_sec):
    """`loss` and `global_step/sec` in model_dir, as the Estimator's hooks write them."""
    if not self._workers.is_chief:
      return
    writer = self._summary_writer(self.model_dir)
    with writer.as_default():
      for tag, value in (("loss", loss), ("global_step/sec", steps_per_sec)):
        _write_scalar(tag, value, step)
    writer.flush()

  def _summary_writer(self, directory):
    if directory not in self._writers:
      self._writers[directory] = tf.summary.create_file_writer(directory)
    return self._writers[directory]

  # Evaluation.

  def _eval_function(self):
    def eval_step(iterator):
      features, labels = _features_and_labels(iterator.get_next())
      results = {}

      def replica(features, labels):
        spec = self._replica_spec(features, labels, ModeKeys.EVAL)
        metrics = getattr(spec, "eval_metrics", None)
        if metrics is None and getattr(spec, "eval_metric_ops", None):
          raise ValueError(
              "the model_fn returned eval_metric_ops; a TPUEstimatorSpec gives "
              "eval_metrics=(metric_fn, tensors), which --engine=distribute runs on the host")
        results["metric_fn"] = metrics[0] if metrics else None
        loss, examples = replica_loss.weighted(spec.loss, features, labels)
        return loss, examples, (metrics[1] if metrics else [])

      with self._store.replicas(), self._store.outside():
        loss, examples, tensors = self.strategy.run(self._replica_fn(replica),
                                                    args=(features, labels))
      loss = replica_loss.combined(self.strategy, loss, examples)
      tensors = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), tensors)
      self._metric_fn = results["metric_fn"]
      return loss, tensors

    return self._function("eval", eval_step)

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
    """One pass: {metric: value, 'loss', 'global_step'}; written to model_dir/eval."""
    runner = distribute_hooks.HookRunner(hooks or [], ModeKeys.EVAL)
    with self.strategy.scope():
      iterator = iter(self._dataset(input_fn, ModeKeys.EVAL))
      function = self._eval_function()
      # The traced shapes: a batch dimension the input leaves open stays open for the metric_fn.
      traced = function.get_concrete_function(iterator).structured_outputs[-1]
      path = self._restore(checkpoint_path)
    if path is None:
      raise ValueError(f"no checkpoint in {self.model_dir} to evaluate: train first")
    step = self._global_step()
    runner.begin()
    runner.after_create_session()
    metrics = None
    losses = []
    while steps is None or len(losses) < steps:
      runner.before_run()
      try:
        with self.strategy.scope():
          loss, tensors = function(iterator)
      except tf.errors.OutOfRangeError:
        break
      # The metric_fn runs on the host, outside the strategy, as TPUEstimator's does.
      if metrics is None:
        metrics = _HostMetrics(self._metric_fn, tensors, traced)
      metrics.update(tensors)
      losses.append(float(loss))
      self._workers.agree_to_stop(False, hooks or [])  # a signal stops every worker's pass
      runner.after_run(step)
    runner.end()
    results = metrics.values() if metrics else {}
    results["loss"] = sum(losses) / max(len(losses), 1)
    results["global_step"] = step
    self._write_eval_summaries(results, step, name)
    return results

  def _write_eval_summaries(self, results, step, name):
    if not self._workers.is_chief:
      return
    directory = os.path.join(self.model_dir, EVAL_DIR if not name else f"{EVAL_DIR}_{name}")
    writer = self._summary_writer(directory)
    with writer.as_default():
      for tag, value in results.items():
        if tag != "global_step":
          _write_scalar(tag, value, step)
    writer.flush()

  # Prediction and export.

  def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
              yield_single_examples=True):
    """Yields the model_fn's predictions, per example (or per batch)."""
    if hooks:
      distribute_hooks.HookRunner(hooks, ModeKeys.PREDICT)
    with self.strategy.scope():
      iterator = iter(self._dataset(input_fn, ModeKeys.PREDICT))
      function = self._function("predict", self._predict_step)
      function.get_concrete_function(iterator)
      if self._restore(checkpoint_path) is None:
        raise ValueError(f"no checkpoint in {self.model_dir} to predict with: train first")
    while True:
      try:
        with self.strategy.scope():
          batch = function(iterator)
      except tf.errors.OutOfRangeError:
        return
      batch = {k: v.numpy() for k, v in batch.items()
               if predict_keys is None or k in predict_keys}
      if not yield_single_examples:
        yield batch
        continue
      for i in range(len(next(iter(batch.values())))):
        yield {k: v[i] for k, v in batch.items()}

  def _predict_step(self, iterator):
    features, _ = _features_and_labels(iterator.get_next())

    def replica(features):
      spec = self._replica_spec(features, None, ModeKeys.PREDICT)
      predictions = spec.predictions
      if not isinstance(predictions, dict):
        predictions = {"predictions": predictions}
      return predictions

    with self._store.replicas(), self._store.outside():
      predictions = self.strategy.run(replica, args=(features,))
    return {k: self.strategy.gather(v, axis=0) for k, v in predictions.items()}

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn, **kwargs):
    """The SavedModel, exported by the estimator from this engine's checkpoint (same names)."""
    if self._export_estimator_fn is None:
      raise ValueError("this engine was built without an exporter")
    if not self._workers.is_chief:  # the chief's export is the run's
      export_dir_base = self._workers.scratch_dir("export")
    return self._export_estimator_fn().export_saved_model(
        export_dir_base, serving_input_receiver_fn, **kwargs)

  def latest_checkpoint(self):
    return tf.train.latest_checkpoint(self.model_dir)


@contextlib.contextmanager
def _quiet_tf_log():
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")
  try:
    yield
  finally:
    logger.setLevel(level)


def _write_scalar(tag, value, step):
  """A scalar as the Estimator writes it (a simple_value Summary), into the default writer."""
  summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag,
                                                                    simple_value=float(value))])
  tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=step)


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
      metrics = metric_fn(**tensors) if isinstance(tensors, dict) else metric_fn(*tensors)
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
    return {name: float(value.numpy()) if value.shape.rank == 0 else value.numpy()
            for name, value in zip(self._names, self._read())}

