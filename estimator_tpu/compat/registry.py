"""The tf.contrib names estimator_tpu.compat knows: mapped, re-implemented or refused.

docs/MIGRATING.md's table is `markdown_table()` of this registry; a test keeps
the two equal. Targets are "module:attribute.path", imported only when the
name is first used. Long because it is a table: one entry per tf.contrib name.
"""

from estimator_tpu.compat._lazy import display_target
from estimator_tpu.compat._lazy import mapped
from estimator_tpu.compat._lazy import refused
from estimator_tpu.compat._lazy import reimplemented

_C = "estimator_tpu.compat."
_V1_TPU = "tensorflow:compat.v1.tpu."
_EST_V1 = "tensorflow_estimator._api.v1.estimator:"
_EST_TPU = _EST_V1 + "tpu."
_DATA = "tensorflow:compat.v1.data.experimental."
_LOOKUP_OPS = "tensorflow.python.ops.lookup_ops:"
_SUMMARY_V2 = "tensorflow.python.ops.summary_ops_v2:"
_EST_EXP = _EST_V1 + "experimental."
# tf_slim, through estimator_tpu.compat.slim (which supplies the TF names tf_slim needs).
_SLIM = "estimator_tpu.compat.slim:tf_slim."
_SLIM_NOTE = "TF 1.15's, which moved into tf-slim with the rest of slim."
_SLIM_LAYER_NOTE = ("tf-slim's layer, which TF 1.15's tf.contrib.layers was: the same "
                    "arguments, arg_scope and variable names (weights, biases, BatchNorm/*).")
# tf.contrib.framework's names that tf_slim.ops.arg_scope / tf_slim.ops.variables hold.
SLIM_FRAMEWORK = (
    "arg_scope", "add_arg_scope", "current_arg_scope", "has_arg_scope",
    "arg_scoped_arguments", "variable", "model_variable", "local_variable",
    "global_variable", "add_model_variable", "get_variables", "get_model_variables",
    "get_local_variables", "get_trainable_variables", "get_unique_variable",
    "get_variables_by_name", "get_variables_by_suffix", "get_variable_full_name",
    "get_variables_to_restore", "filter_variables", "assign_from_checkpoint",
    "assign_from_checkpoint_fn", "assign_from_values", "assign_from_values_fn",
    "assert_global_step", "assert_or_get_global_step", "create_global_step",
    "VariableDeviceChooser")
_SUMMARY_NOTE = ("TF-internal module tf.contrib.summary re-exported in 1.15; "
                 "records only under always_record_summaries() or "
                 "record_summaries_every_n_global_steps(); step defaults to "
                 "the global step.")

TPU = {
    "TPUEstimator": mapped(
        _EST_TPU + "TPUEstimator",
        "Same class. export_savedmodel is still there (deprecated alias of "
        "export_saved_model). use_tpu=False runs on CPU/GPU."),
    "TPUEstimatorSpec": reimplemented(
        _C + "tpu:TPUEstimatorSpec",
        "Subclass of tf.compat.v1.estimator.tpu.TPUEstimatorSpec. Off TPU "
        "eval_metrics may also be a dict of metric ops; on TPU that raises "
        "ValueError asking for (metric_fn, tensors)."),
    "RunConfig": mapped(_EST_TPU + "RunConfig"),
    "TPUConfig": mapped(_EST_TPU + "TPUConfig"),
    "InputPipelineConfig": mapped(_EST_TPU + "InputPipelineConfig"),
    "CrossShardOptimizer": reimplemented(
        _C + "tpu:CrossShardOptimizer",
        "Subclass of tf.compat.v1.tpu.CrossShardOptimizer. Outside a TPU "
        "computation it acts as the optimizer it wraps (one INFO line) "
        "instead of emitting CrossReplicaSum, which has no CPU/GPU kernel."),
    "bfloat16_scope": mapped(_V1_TPU + "bfloat16_scope"),
    "outside_compilation": mapped(_V1_TPU + "outside_compilation"),
    "rewrite": mapped(_V1_TPU + "rewrite"),
    "shard": mapped(_V1_TPU + "shard"),
    "replicate": mapped(_V1_TPU + "replicate"),
    "batch_parallel": mapped(_V1_TPU + "batch_parallel"),
    "initialize_system": mapped(_V1_TPU + "initialize_system"),
    "shutdown_system": mapped(_V1_TPU + "shutdown_system"),
    "core": mapped(_V1_TPU + "core"),
    "cross_replica_sum": mapped(_V1_TPU + "cross_replica_sum"),
    "repeat": mapped("tensorflow.python.tpu.training_loop:repeat",
                     "TF-internal module; same function."),
    "while_loop": mapped("tensorflow.python.tpu.training_loop:while_loop",
                         "TF-internal module; same function."),
    "InfeedQueue": mapped("tensorflow.python.tpu.tpu_feed:InfeedQueue",
                          "TF-internal module; same class."),
    "AsyncCheckpointSaverHook": reimplemented(
        _C + "checkpoint_hooks:AsyncCheckpointSaverHook",
        "CheckpointSaverHook's files, cadence and listeners, saved in the "
        "training thread: TF 2.15's background save fails on resource "
        "variables and TF 2.16 removed the class."),
    "DeviceAssignment": mapped("tensorflow:tpu.experimental.DeviceAssignment"),
    "Topology": mapped("tensorflow:tpu.experimental.Topology"),
    "device_assignment": mapped(
        "tensorflow.python.tpu.device_assignment:device_assignment",
        "TF-internal module; same function."),
    "keras_to_tpu_model": refused(
        "Keras on TPU moved to tf.distribute: build and compile the model "
        "inside `with tf.distribute.TPUStrategy(resolver).scope():`, then "
        "model.fit"),
    "TPUDistributionStrategy": refused(
        "use tf.distribute.TPUStrategy (tf.compat.v1.distribute.experimental."
        "TPUStrategy in graph-mode code)"),
    "export_estimator_savedmodel": refused(
        "call export_saved_model(export_dir_base, serving_input_receiver_fn) "
        "on the TPUEstimator itself (export_to_tpu=False gives a CPU-only "
        "SavedModel)"),
    "profiler": refused(
        "use tf.profiler.experimental (start/stop, or client.trace for a "
        "Cloud TPU) and the TensorBoard profile plugin"),
}

CLUSTER_RESOLVER = {
    "TPUClusterResolver": reimplemented(
        _C + "cluster_resolver:TPUClusterResolver",
        "tpu=None or '' with no TPU_NAME in the environment returns a local "
        "resolver (master '') that a use_tpu=False run ignores, with one "
        "INFO line, instead of raising ValueError (tensorflow/tpu#160)."),
    **{name: mapped("tensorflow:distribute.cluster_resolver." + name)
       for name in ("ClusterResolver", "SimpleClusterResolver",
                    "UnionResolver", "GCEClusterResolver",
                    "KubernetesClusterResolver", "SlurmClusterResolver",
                    "TFConfigClusterResolver")},
}

# tf.compat.v1 names whose TF 2 behaviour differs from TF 1.15's, served as TF 1.15 had them.
V1_OVERLAYS = {
    "distribute": {"cluster_resolver": {"TPUClusterResolver": CLUSTER_RESOLVER[
        "TPUClusterResolver"]}},
}

_DATA_MAPPED = (
    "map_and_batch", "shuffle_and_repeat", "AUTOTUNE", "unbatch",
    "ignore_errors", "prefetch_to_device", "copy_to_device", "group_by_window",
    "group_by_reducer", "Reducer", "bucket_by_sequence_length",
    "choose_from_datasets", "sample_from_datasets", "make_csv_dataset",
    "make_batched_features_dataset", "get_single_element", "rejection_resample",
    "scan", "enumerate_dataset", "Counter", "CsvDataset", "SqlDataset",
    "dense_to_sparse_batch", "Optional", "get_next_as_optional",
    "parse_example_dataset", "unique", "make_saveable_from_iterator")

DATA = {
    "parallel_interleave": mapped(
        _DATA + "parallel_interleave",
        "Deprecated in TF 2 but unchanged; TF 2 style is "
        "Dataset.interleave(fn, cycle_length, num_parallel_calls=AUTOTUNE, "
        "deterministic=False)."),
    **{name: mapped(_DATA + name) for name in _DATA_MAPPED},
    "TFRecordDataset": mapped("tensorflow:data.TFRecordDataset"),
    "CheckpointInputPipelineHook": reimplemented(
        _C + "checkpoint_hooks:CheckpointInputPipelineHook",
        "Saves the input iterators beside the model checkpoints (input.ckpt-N, "
        "checkpoint_input) and restores them on resume, as TF 1.15 did; TF "
        "2.16 removed the class."),
    "batch_and_drop_remainder": reimplemented(
        _C + "data:batch_and_drop_remainder",
        "Returns lambda ds: ds.batch(n, drop_remainder=True)."),
    "padded_batch_and_drop_remainder": reimplemented(
        _C + "data:padded_batch_and_drop_remainder",
        "Returns lambda ds: ds.padded_batch(..., drop_remainder=True)."),
    "assert_element_shape": reimplemented(
        _C + "data:assert_element_shape",
        "Returns lambda ds: ds.map(tf.ensure_shape over the element)."),
    "sliding_window_batch": refused(
        "use dataset.window(size, shift, stride, drop_remainder=True)"
        ".flat_map(lambda w: w.batch(size))"),
    "read_batch_features": refused(
        "use tf.data.experimental.make_batched_features_dataset"),
    "LMDBDataset": refused(
        "TF 2 has no LMDB reader; convert the records to TFRecord and "
        "use tf.data.TFRecordDataset"),
}

LOOKUP = {
    "index_table_from_tensor": reimplemented(
        _C + "lookup:index_table_from_tensor",
        "Keeps the TF 1 argument name `mapping` (TF 2: vocabulary_list) over "
        "the same lookup_ops table, so OOV bucket ids are unchanged."),
    "index_to_string_table_from_tensor": reimplemented(
        _C + "lookup:index_to_string_table_from_tensor",
        "Keeps the TF 1 argument name `mapping`."),
    "index_table_from_file": mapped(_LOOKUP_OPS + "index_table_from_file",
                                    "TF-internal module; same function."),
    "index_to_string_table_from_file": mapped(
        _LOOKUP_OPS + "index_to_string_table_from_file",
        "TF-internal module; same function."),
    "HashTable": mapped("tensorflow:compat.v1.lookup.StaticHashTable",
                        "Renamed StaticHashTable; same behaviour."),
    "KeyValueTensorInitializer": mapped(
        "tensorflow:compat.v1.lookup.KeyValueTensorInitializer"),
    "TextFileInitializer": mapped(
        "tensorflow:compat.v1.lookup.TextFileInitializer"),
    "TextFileIndex": mapped("tensorflow:compat.v1.lookup.TextFileIndex"),
    "MutableHashTable": mapped(
        "tensorflow:compat.v1.lookup.experimental.MutableHashTable"),
    "MutableDenseHashTable": mapped(
        "tensorflow:compat.v1.lookup.experimental.DenseHashTable",
        "Renamed DenseHashTable."),
    **{name: mapped(_LOOKUP_OPS + name, "TF-internal module; same class.")
       for name in ("TextFileIdTableInitializer",
                    "TextFileStringTableInitializer", "IdTableWithHashBuckets",
                    "HasherSpec", "FastHashSpec", "StrongHashSpec")},
    "string_to_index": refused(
        "use index_table_from_tensor(mapping).lookup(keys) and run "
        "tf.tables_initializer()"),
    "index_to_string": refused(
        "use index_to_string_table_from_tensor(mapping).lookup(ids)"),
    "string_to_index_table_from_tensor": refused(
        "use index_table_from_tensor (the renamed function)"),
}

LAYERS = {
    "optimize_loss": reimplemented(
        _C + "optimize_loss:optimize_loss",
        "TF 1.15 semantics: optimizer as name/class/instance/callable(lr), "
        "float clip_gradients clips the global norm, tf.compat.v1.summary "
        "summaries; the result evaluates to the loss and increments "
        "global_step."),
    "OPTIMIZER_CLS_NAMES": reimplemented(
        _C + "optimize_loss:OPTIMIZER_CLS_NAMES",
        "Adagrad, Adam, Ftrl, Momentum (0.9), RMSProp, SGD."),
    "layer_norm": reimplemented(
        _C + "layers:layer_norm",
        "Same variables (LayerNorm/beta, LayerNorm/gamma) and epsilon 1e-12, "
        "so BERT-era checkpoints restore."),
    "variance_scaling_initializer": reimplemented(
        _C + "layers:variance_scaling_initializer",
        "TF 1 formula (truncated normal stddev sqrt(1.3*factor/n)); differs "
        "from tf.compat.v1.variance_scaling_initializer's constant."),
    "xavier_initializer": reimplemented(
        _C + "layers:xavier_initializer",
        "variance_scaling_initializer(1.0, 'FAN_AVG', uniform)."),
    "xavier_initializer_conv2d": reimplemented(
        _C + "layers:xavier_initializer", "Same as xavier_initializer."),
    "l2_regularizer": reimplemented(
        _C + "layers:l2_regularizer",
        "scale * tf.nn.l2_loss(w) (half the sum of squares, unlike "
        "tf.keras.regularizers.l2)."),
    "l1_regularizer": reimplemented(_C + "layers:l1_regularizer",
                                    "scale * sum(|w|)."),
    "flatten": mapped("tensorflow:compat.v1.layers.flatten"),
    **{name: mapped(_SLIM + name, _SLIM_LAYER_NOTE)
       for name in ("conv2d", "fully_connected", "batch_norm", "max_pool2d",
                    "avg_pool2d", "dropout", "separable_conv2d", "conv2d_transpose",
                    "repeat", "stack", "one_hot_encoding", "unit_norm", "softmax",
                    "bias_add", "convolution2d")},
    "embed_sequence": refused(
        "use tf.nn.embedding_lookup on a tf.compat.v1.get_variable, or "
        "tf.keras.layers.Embedding"),
    "real_valued_column": refused("use tf.feature_column.numeric_column"),
    "sparse_column_with_hash_bucket": refused(
        "use tf.feature_column.categorical_column_with_hash_bucket"),
}

_EVAL = "tensorflow.python.training.evaluation:"

TRAINING = {
    "checkpoints_iterator": mapped(
        "tensorflow:compat.v1.train.checkpoints_iterator",
        "The function TF 1.15's tf.contrib.training re-exported: yields each "
        "new checkpoint path, at most one per min_interval_secs, polling each "
        "second; timeout_fn is asked after each checkpoint and after `timeout` "
        "seconds without one, and True ends the loop (no timeout_fn: a timeout "
        "ends it)."),
    "wait_for_new_checkpoint": mapped(
        "tensorflow.python.training.checkpoint_utils:wait_for_new_checkpoint",
        "TF-internal module; same function: the newest checkpoint path other "
        "than last_checkpoint, polling every seconds_to_sleep, or None after "
        "`timeout` seconds."),
    "evaluate_once": mapped(
        _EVAL + "_evaluate_once",
        "TF-internal module; the same function under its TF 2 private name."),
    "StopAfterNEvalsHook": mapped(
        _EVAL + "_StopAfterNEvalsHook",
        "TF-internal module; the same class under its TF 2 private name."),
    "get_or_create_eval_step": mapped(
        _EVAL + "_get_or_create_eval_step",
        "TF-internal module; the same function under its TF 2 private name."),
    "evaluate_repeatedly": reimplemented(
        _C + "evaluation:evaluate_repeatedly",
        "TF 1.15 semantics over tf.train.checkpoints_iterator: each new "
        "checkpoint is restored in a MonitoredSession and eval_ops run until a "
        "hook stops it (StopAfterNEvalsHook counts them); eval_interval_secs, "
        "timeout, timeout_fn and max_number_of_evaluations as before; returns "
        "final_ops' values from the last evaluation. TF 2 removed it."),
    "SummaryAtEndHook": reimplemented(
        _C + "evaluation:SummaryAtEndHook",
        "Writes the merged summaries (or summary_op) once when an evaluation "
        "ends, at the restored global step. TF 2 removed it."),
    "HParams": reimplemented(
        _C + "hparams:HParams",
        "Constructor kwargs, attributes, add_hparam, set_hparam, del_hparam, "
        "parse('a=1,b=x') with type coercion, override_from_dict, to_json, "
        "parse_json, values, get, `in`. Not kept: to_proto/from_proto, "
        "parse('a[1]=2')."),
    "bucket_by_sequence_length": refused(
        "use tf.data.experimental.bucket_by_sequence_length"),
    "stratified_sample": refused(
        "use tf.data.experimental.rejection_resample"),
}

_SUMMARY_MAPPED = (
    "create_summary_file_writer",
    "always_record_summaries", "never_record_summaries",
    "record_summaries_every_n_global_steps", "scalar", "histogram", "image",
    "audio", "generic", "import_event", "summary_writer_initializer_op",
    "eval_dir")

SUMMARY = {
    "create_file_writer": reimplemented(
        _C + "summary:create_file_writer",
        "TF 1.15's writer, built in tf.init_scope(): a host_call may run inside "
        "a loop (off TPU, --iterations_per_loop steps per session.run)."),
    **{name: mapped(_SUMMARY_V2 + name, _SUMMARY_NOTE)
       for name in _SUMMARY_MAPPED},
    "should_record_summaries": mapped(
        _SUMMARY_V2 + "_legacy_contrib_should_record_summaries",
        _SUMMARY_NOTE),
    "graph": mapped(_SUMMARY_V2 + "graph_v1", _SUMMARY_NOTE),
    "flush": mapped(_SUMMARY_V2 + "legacy_raw_flush", _SUMMARY_NOTE),
    "all_summary_ops": mapped("tensorflow:compat.v1.summary.all_v2_summary_ops",
                              "Renamed all_v2_summary_ops."),
    "initialize": mapped("tensorflow:compat.v1.summary.initialize"),
    "SummaryWriter": mapped("tensorflow:summary.SummaryWriter"),
    "create_db_writer": refused(
        "TF 2 has no SQLite summary writer; use create_file_writer"),
}

FRAMEWORK = {
    "get_or_create_global_step": mapped(
        "tensorflow:compat.v1.train.get_or_create_global_step"),
    "get_global_step": mapped("tensorflow:compat.v1.train.get_global_step"),
    "nest": mapped("tensorflow:nest",
                   "tf.nest; assert_same_structure/flatten/map_structure."),
    "is_tensor": mapped("tensorflow:is_tensor"),
    "list_variables": mapped("tensorflow:train.list_variables"),
    "load_variable": mapped("tensorflow:train.load_variable"),
    **{name: mapped(_SLIM + name, _SLIM_NOTE) for name in SLIM_FRAMEWORK},
}

ESTIMATOR = {
    **{name: mapped(_EST_EXP + name)
       for name in ("stop_if_no_decrease_hook", "stop_if_no_increase_hook",
                    "stop_if_higher_hook", "stop_if_lower_hook",
                    "make_early_stopping_hook", "InMemoryEvaluatorHook",
                    "build_raw_supervised_input_receiver_fn", "call_logit_fn",
                    "dnn_logit_fn_builder", "linear_logit_fn_builder")},
    "add_metrics": mapped(_EST_V1 + "add_metrics"),
    "replicate_model_fn": refused(
        "pass RunConfig(train_distribute=tf.distribute.MirroredStrategy()) "
        "to a tf.estimator.Estimator (TPUEstimator replicates by itself)"),
    "TowerOptimizer": refused(
        "not needed with RunConfig(train_distribute=...); on TPU use "
        "tf.contrib.tpu.CrossShardOptimizer"),
    "forward_features": refused(
        "add the feature to the predictions dict in your model_fn"),
    "multi_head": refused("use tf.estimator.MultiHead"),
    "binary_classification_head": refused("use tf.estimator.BinaryClassHead"),
    "multi_class_head": refused("use tf.estimator.MultiClassHead"),
    "multi_label_head": refused("use tf.estimator.MultiLabelHead"),
    "regression_head": refused("use tf.estimator.RegressionHead"),
    "RNNClassifier": refused(
        "use tf.estimator.experimental.RNNClassifier (Keras-based; its "
        "arguments differ) or a Keras model"),
    "export_all_saved_models": refused(
        "use estimator.experimental_export_all_saved_models"),
}

DISTRIBUTE = {
    "TPUStrategy": mapped(
        "tensorflow:compat.v1.distribute.experimental.TPUStrategy",
        "Needs a real TPU and its resolver; TPUEstimator does not use it."),
    "MirroredStrategy": mapped("tensorflow:compat.v1.distribute.MirroredStrategy"),
    "OneDeviceStrategy": mapped(
        "tensorflow:compat.v1.distribute.OneDeviceStrategy"),
    "ParameterServerStrategy": mapped(
        "tensorflow:compat.v1.distribute.experimental.ParameterServerStrategy"),
    "initialize_tpu_system": mapped(
        "tensorflow:tpu.experimental.initialize_tpu_system"),
    "CollectiveAllReduceStrategy": refused(
        "use tf.distribute.experimental.MultiWorkerMirroredStrategy"),
}

UTIL = {
    "make_tensor_proto": mapped("tensorflow:compat.v1.make_tensor_proto"),
    "make_ndarray": mapped("tensorflow:make_ndarray"),
    "constant_value": mapped("tensorflow:get_static_value",
                             "Renamed tf.get_static_value."),
}

# Whole tf.contrib modules that left TensorFlow as a package of their own (pinned in every lock).
MAPPED_MODULES = {
    "slim": mapped(
        _SLIM.rstrip("."),
        "The tf-slim package (its last release): the same layers, arg_scope, "
        "variables, nets, data decoders and learning loop, and the same variable "
        "names, so slim checkpoints restore (estimator_tpu.compat.slim)."),
}

# Whole tf.contrib modules TF 2 has in no form.
REFUSED_MODULES = {
    "learn": refused(
        "tf.contrib.learn was replaced by tf.estimator; use "
        "tf.estimator.train_and_evaluate (or a train/evaluate loop) for "
        "Experiment and learn_runner, and tf.contrib.tpu.TPUEstimator or "
        "tf.compat.v1.estimator.Estimator for learn.Estimator"),
    "image": refused(
        "use tf.image (resize, flips, crops, adjust_*); rotate/transform are "
        "in tensorflow-addons (tfa.image)"),
    "keras": refused("use tf.keras"),
    "rnn": refused(
        "use tf.compat.v1.nn.rnn_cell (LSTMCell, GRUCell, MultiRNNCell, "
        "DropoutWrapper) or tf.keras.layers.LSTM/GRU"),
    "cudnn_rnn": refused(
        "use tf.keras.layers.LSTM/GRU, which use cuDNN on GPU by themselves"),
    "seq2seq": refused(
        "use tensorflow-addons (tfa.seq2seq) or tf.keras.layers.Attention"),
    "eager": refused(
        "eager execution is TF 2's default; use tf.Variable for "
        "tfe.Variable, tf.function for tfe.defun, iter(dataset) for "
        "tfe.Iterator"),
    "quantize": refused(
        "use the tensorflow-model-optimization package "
        "(tfmot.quantization.keras)"),
    "losses": refused(
        "use tf.losses (tf.compat.v1.losses): softmax_cross_entropy, "
        "sparse_softmax_cross_entropy, mean_squared_error, ... keep their names"),
    "metrics": refused(
        "use tf.metrics (tf.compat.v1.metrics): streaming_accuracy is "
        "tf.metrics.accuracy, streaming_auc is tf.metrics.auc, and so on"),
    "opt": refused(
        "use tf.train (tf.compat.v1.train) optimizers; AdamW, LazyAdam and "
        "MovingAverage are in tensorflow-addons (tfa.optimizers)"),
    "predictor": refused(
        "load the export with tf.saved_model.load(export_dir) and call "
        ".signatures['serving_default'](...)"),
    "saved_model": refused("use tf.saved_model or tf.compat.v1.saved_model"),
    "checkpoint": refused("use tf.train.Checkpoint and tf.train.CheckpointManager"),
    "compiler": refused(
        "use tf.function(jit_compile=True) for XLA, or "
        "tf.compat.v1.tpu.rewrite for TPU"),
    "gan": refused("use the tensorflow-gan package (tfgan)"),
    "distributions": refused(
        "use the tensorflow-probability package (tfp.distributions)"),
    "crf": refused("use tensorflow-addons (tfa.text.crf_log_likelihood)"),
    "tensorboard": refused(
        "write summaries with tf.summary / tf.compat.v1.summary; the "
        "projector lives in the tensorboard package"),
    "boosted_trees": refused("use TensorFlow Decision Forests"),
    "tensor_forest": refused("use TensorFlow Decision Forests"),
    "timeseries": refused(
        "use tensorflow-probability (tfp.sts) or a Keras model"),
    "factorization": refused(
        "use tf.compat.v1.estimator.experimental.KMeans for KMeans; WALS "
        "has no TF 2 home"),
    "graph_editor": refused(
        "no TF 2 replacement: rebuild the graph, or use "
        "tf.compat.v1.graph_util to edit a GraphDef"),
    "cloud": refused("use the tensorflow-io package (BigQuery readers)"),
    "bigtable": refused("use the tensorflow-io package (Bigtable readers)"),
}

CONTRIB = {
    "tpu": TPU,
    "cluster_resolver": CLUSTER_RESOLVER,
    "data": DATA,
    "lookup": LOOKUP,
    "layers": LAYERS,
    "training": TRAINING,
    "summary": SUMMARY,
    "framework": FRAMEWORK,
    "estimator": ESTIMATOR,
    "distribute": DISTRIBUTE,
    "util": UTIL,
    **MAPPED_MODULES,
    **REFUSED_MODULES,
}

# TF 1.15 module paths under tensorflow.contrib (beyond tensorflow.contrib.<module>
# itself) -> (the tf.contrib module whose entries they held, those names; None: all).
# `import tensorflow.contrib...` resolves them to the objects the attribute form gives.
MODULE_PATHS = {
    "tpu.python.tpu.tpu_estimator": (
        "tpu", ("TPUEstimator", "TPUEstimatorSpec", "export_estimator_savedmodel")),
    "tpu.python.tpu.tpu_config": ("tpu", ("RunConfig", "TPUConfig", "InputPipelineConfig")),
    "tpu.python.tpu.tpu_optimizer": ("tpu", ("CrossShardOptimizer",)),
    "tpu.python.tpu.async_checkpoint": ("tpu", ("AsyncCheckpointSaverHook",)),
    "tpu.python.tpu.bfloat16": ("tpu", ("bfloat16_scope",)),
    "tpu.python.tpu.tpu": (
        "tpu", ("rewrite", "shard", "replicate", "batch_parallel", "initialize_system",
                "shutdown_system", "core", "outside_compilation")),
    "tpu.python.tpu.training_loop": ("tpu", ("repeat", "while_loop")),
    "tpu.python.tpu.tpu_feed": ("tpu", ("InfeedQueue",)),
    "tpu.python.tpu.device_assignment": ("tpu", ("DeviceAssignment", "device_assignment")),
    "tpu.python.tpu.topology": ("tpu", ("Topology",)),
    "tpu.python.ops.tpu_ops": ("tpu", ("cross_replica_sum",)),
    "cluster_resolver.python.training.tpu_cluster_resolver": (
        "cluster_resolver", ("TPUClusterResolver",)),
    "training.python.training.evaluation": (
        "training", ("checkpoints_iterator", "wait_for_new_checkpoint", "evaluate_once",
                     "evaluate_repeatedly", "StopAfterNEvalsHook", "SummaryAtEndHook",
                     "get_or_create_eval_step")),
    "training.python.training.hparam": ("training", ("HParams",)),
    "summary.summary": ("summary", None),
    "data.python.ops.batching": (
        "data", ("map_and_batch", "batch_and_drop_remainder", "padded_batch_and_drop_remainder",
                 "unbatch", "assert_element_shape", "dense_to_sparse_batch")),
    "data.python.ops.interleave_ops": (
        "data", ("parallel_interleave", "sample_from_datasets", "choose_from_datasets")),
    "data.python.ops.shuffle_ops": ("data", ("shuffle_and_repeat",)),
    "layers.python.layers.optimizers": ("layers", ("optimize_loss", "OPTIMIZER_CLS_NAMES")),
    "layers.python.layers.initializers": (
        "layers", ("variance_scaling_initializer", "xavier_initializer",
                   "xavier_initializer_conv2d")),
    "layers.python.layers.regularizers": ("layers", ("l1_regularizer", "l2_regularizer")),
    "lookup.lookup_ops": ("lookup", None),
    # Its __init__ star-imported arg_scope and variables: the functions, not the modules.
    "framework.python.ops": ("framework", SLIM_FRAMEWORK),
}

# TF 1.15 module paths under tensorflow.contrib, by rule: `tensorflow.contrib.<prefix>.<rest>`
# is the first module `<home>.<rest>` that exists, for the homes listed (TF 2 moved these
# modules whole: the same objects under another package). MODULE_PATHS, the tf.contrib
# namespaces and the refused modules come first. tests/test_compat_paths.py checks each
# row against the installed TensorFlow; a missing path is one row (or one home) more.
MODULE_RULES = {
    "tpu.python.tpu": ("tensorflow_estimator.python.estimator.tpu", "tensorflow.python.tpu"),
    "cluster_resolver.python.training": ("tensorflow.python.distribute.cluster_resolver",),
    "data.python.ops": ("tensorflow.python.data.experimental.ops",),
    "distribute.python": ("tensorflow.python.distribute",),
    "estimator.python.estimator": ("tensorflow_estimator.python.estimator",),
    # TF 1.15's slim and the contrib modules it was made of, now the tf-slim package.
    "slim.python.slim.data": ("tf_slim.data",),
    "slim.python.slim.nets": ("tf_slim.nets",),
    "slim.python.slim": ("tf_slim",),
    "slim": ("tf_slim",),
    "framework.python.ops": ("tf_slim.ops",),
    "layers.python.layers": ("tf_slim.layers",),
}


def rule_homes(relative):
  """[module, ...] that `tensorflow.contrib.<relative>` may be, by MODULE_RULES; [] if none."""
  for prefix, homes in MODULE_RULES.items():
    if relative.startswith(prefix + "."):
      return [home + relative[len(prefix):] for home in homes]
  return []


# TF-internal packages TF 1 code imported that moved to another package. The alias
# serves a path only where TensorFlow has no module of its own (TF 2.15 still has
# forwarding modules under tensorflow.python.estimator; TF 2.21 has none).
MOVED_PACKAGES = {
    "tensorflow.python.estimator": "tensorflow_estimator.python.estimator",
}


# TF 1's public modules by path (`from tensorflow.gfile import Exists`, `import
# tensorflow.logging`, `tensorflow.saved_model.loader`): `tensorflow.<rest>` is
# `tensorflow.compat.v1.<rest>` where TensorFlow has no module `tensorflow.<rest>` of its own
# and its tf.compat.v1 has one (a module of TensorFlow's, not one this package serves).
# TensorFlow's own packages below hold no TF 1 API path; they are passed over at once.
V1_API = ("tensorflow", "tensorflow.compat.v1")
TF_OWN_PACKAGES = ("python", "compat", "core", "contrib", "_api")
# One TF 1 public module per line, with a name it held: tests/test_compat_paths.py imports each.
V1_EXAMPLES = (
    ("gfile", "Exists"), ("logging", "info"), ("app", "run"), ("app", "flags"),
    ("python_io", "TFRecordWriter"),
    ("layers", "dense"), ("losses", "softmax_cross_entropy"), ("metrics", "accuracy"),
    ("initializers", "variance_scaling"), ("resource_loader", "get_data_files_path"),
    ("saved_model.loader", "load"), ("train.queue_runner", "QueueRunner"),
    ("manip", "roll"), ("spectral", "fft"), ("user_ops", "my_fact"),
)


def module_path_entries(relative):
  """{name: Entry} of `tensorflow.contrib.<relative>` (a MODULE_PATHS key)."""
  module, names = MODULE_PATHS[relative]
  entries = CONTRIB[module]
  return dict(entries) if names is None else {name: entries[name] for name in names}


TABLE_HEADER = "| TF1 name | compat maps to | kind | notes |"
MODULE_TABLE_HEADER = "| TF 1 module path | the names it gives | same objects as |"


def rows(entries=None, prefix="tf.contrib"):
  """Yields (TF 1 name, Entry) for every registered name, in registry order."""
  for name, entry in (CONTRIB if entries is None else entries).items():
    path = f"{prefix}.{name}"
    if isinstance(entry, dict):
      yield from rows(entry, path)
    else:
      yield path, entry


def _table(named_entries):
  lines = [TABLE_HEADER, "|---|---|---|---|"]
  for path, entry in named_entries:
    target = (f"`{display_target(entry.target)}`" if entry.target
              else "AttributeError")
    note = entry.note.replace("|", "\\|")
    lines.append(f"| `{path}` | {target} | {entry.kind} | {note} |")
  return "\n".join(lines)


def markdown_tables():
  """docs/MIGRATING.md's tables: one per tf.contrib module, then the gone ones."""
  sections = []
  for name, entries in CONTRIB.items():
    if isinstance(entries, dict):
      prefix = f"tf.contrib.{name}"
      sections.append((f"`{prefix}`", _table(rows(entries, prefix))))
  sections.append(("Whole `tf.contrib` modules that are a package now",
                   _table(rows(MAPPED_MODULES))))
  sections.append(("Whole `tf.contrib` modules TF 2 has in no form",
                   _table(rows(REFUSED_MODULES))))
  sections.append(("Module paths", _module_table()))
  return "\n\n".join(f"### {title}\n\n{table}" for title, table in sections)


def _module_table():
  lines = [MODULE_TABLE_HEADER, "|---|---|---|"]
  for name, entries in CONTRIB.items():
    if isinstance(entries, dict):
      lines.append(f"| `tensorflow.contrib.{name}` | all of `tf.contrib.{name}` "
                   f"| `tf.contrib.{name}` |")
  for relative, (module, names) in MODULE_PATHS.items():
    given = f"all of `tf.contrib.{module}`" if names is None else ", ".join(
        f"`{name}`" for name in names)
    lines.append(f"| `tensorflow.contrib.{relative}` | {given} | `tf.contrib.{module}.*` |")
  for prefix, homes in MODULE_RULES.items():
    given = " or ".join(f"`{home}.*`" for home in homes)
    lines.append(f"| `tensorflow.contrib.{prefix}.*` (any other) | all of the module | "
                 f"the first of {given} that exists |")
  for old, new in MOVED_PACKAGES.items():
    lines.append(f"| `{old}` and its submodules | where TensorFlow has none: the module "
                 f"of the same path under `{new}` | `{new}` |")
  old, new = V1_API
  lines.append(f"| `{old}.*` (TF 1's public modules: `{old}.gfile`, `{old}.logging`, ...) "
               f"| where TensorFlow has none: the module of the same path under `{new}` "
               f"| `{new}` |")
  return "\n".join(lines)
