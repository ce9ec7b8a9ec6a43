"""Every stack: TPU-embedding configuration builds and checks; only the TPU's use is refused.

tests/conftest.py imports estimator_tpu first, which serves `tensorflow.python.tpu.tpu_embedding`
from its stand-in where TensorFlow (>= 2.16) lacks the module.
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding
from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as embedding_lib
from tensorflow_estimator.python.estimator.tpu import tpu_config
from tensorflow_estimator.python.estimator.tpu import tpu_estimator

from estimator_tpu import tf_standins
from estimator_tpu.tf_standins import _refusal

STANDIN = "tensorflow.python.tpu.tpu_embedding" in tf_standins.active()


def _identity(key, buckets, sequence=False):
  fc = tf.feature_column
  make = (fc.sequence_categorical_column_with_identity if sequence
          else fc.categorical_column_with_identity)
  return make(key=key, num_buckets=buckets)


def test_configs_from_tpu_embedding_columns_name_tables_sizes_and_weights():
  tpu_fc = tf.compat.v1.tpu.experimental
  weighted = tf.feature_column.weighted_categorical_column(_identity("w", 6), "w_weight")
  plain = tpu_fc.embedding_column(_identity("a", 3), dimension=2, combiner="sum",
                                  initializer=lambda: "init_a")
  shared_b, shared_w = tpu_fc.shared_embedding_columns([_identity("b", 6), weighted],
                                                       dimension=5, combiner="sqrtn")
  sequence = tpu_fc.embedding_column(_identity("s", 7, sequence=True), dimension=3,
                                     max_sequence_length=4)
  tables, features = embedding_lib.get_configs_from_feature_columns(
      [plain, shared_b, shared_w, sequence])
  shared_table = "tbl_b_w_weighted_by_w_weight_shared_embedding"
  assert sorted(tables) == sorted(["tbl_a", shared_table, "tbl_s"])
  assert [(tables[t].vocabulary_size, tables[t].dimension, tables[t].combiner)
          for t in ("tbl_a", shared_table, "tbl_s")] == [(3, 2, "sum"), (6, 5, "sqrtn"),
                                                         (7, 3, "mean")]
  assert tables["tbl_a"].initializer() == "init_a"
  assert {k: (f.table_id, f.max_sequence_length, f.weight_key) for k, f in features.items()} == {
      "a": ("tbl_a", 0, None), "b": (shared_table, 0, None),
      "w": (shared_table, 0, "w_weight"), "s": ("tbl_s", 4, None)}
  assert all(isinstance(f, tpu_embedding.FeatureConfig) for f in features.values())


def test_table_config_defaults_and_checks():
  table = tpu_embedding.TableConfig(vocabulary_size=100, dimension=16)
  assert (table.combiner, table.hot_id_replication, table.learning_rate) == ("mean", False, None)
  assert table.initializer.stddev == pytest.approx(0.25)  # 1 / sqrt(dimension)
  assert table.initializer.mean == 0.0
  with pytest.raises(ValueError, match=r"vocabulary_size must >= 1. Received: 0"):
    tpu_embedding.TableConfig(0, 4)
  with pytest.raises(ValueError, match=r"dimension must be a positive int. Received: 2.5"):
    tpu_embedding.TableConfig(10, 2.5)
  with pytest.raises(ValueError, match=r'combiner must be "mean", "sum", "sqrtn" or None. '
                                       r"Received: max"):
    tpu_embedding.TableConfig(10, 2, combiner="max")
  with pytest.raises(ValueError, match="At most one of learning_rate and learning_rate_fn"):
    tpu_embedding.TableConfig(10, 2, learning_rate=0.1, learning_rate_fn=lambda step: 0.1)
  with pytest.raises(ValueError, match="must inherit from `_OptimizationParameters`"):
    tpu_embedding.TableConfig(10, 2, optimization_parameters="adagrad")
  with pytest.raises(ValueError,
                     match="max_sequence_length must be zero or a positive int, got -1"):
    tpu_embedding.FeatureConfig("t", max_sequence_length=-1)


def test_optimizer_parameters_keep_arguments_and_refuse_bad_values():
  adagrad = tpu_embedding.AdagradParameters(0.05)
  assert (adagrad.learning_rate, adagrad.initial_accumulator,
          adagrad.use_gradient_accumulation) == (0.05, 0.1, True)
  adam = tpu_embedding.AdamParameters(0.01, beta2=0.99)
  assert (adam.beta1, adam.beta2, adam.epsilon, adam.lazy_adam) == (0.9, 0.99, 1e-08, True)
  ftrl = tpu_embedding.FtrlParameters(0.1, l1_regularization_strength=0.5)
  assert (ftrl.learning_rate_power, ftrl.initial_linear_value,
          ftrl.l1_regularization_strength) == (-0.5, 0.0, 0.5)
  rms = tpu_embedding.RMSPropParameters(0.1, rho=0.9, momentum=0.8, epsilon=1e-7)
  assert (rms.rho, rms.momentum, rms.epsilon) == (0.9, 0.8, 1e-7)
  assert tpu_embedding.StochasticGradientDescentParameters(0.3).clip_weight_max is None
  refusals = [
      (lambda: tpu_embedding.AdagradParameters(0.1, initial_accumulator=0),
       "Adagrad initial_accumulator must be greater than zero. Received: 0."),
      (lambda: tpu_embedding.AdamParameters(0.1, beta1=1.0),
       "beta1 must be between 0. and 1; got 1.0."),
      (lambda: tpu_embedding.AdamParameters(0.1, lazy_adam=False, use_gradient_accumulation=False),
       "When disabling Lazy Adam, gradient accumulation must be used."),
      (lambda: tpu_embedding.FtrlParameters(0.1, learning_rate_power=0.5),
       "learning_rate_power must be less than or equal to 0. got 0.5."),
      (lambda: tpu_embedding.ProximalAdagradParameters(0.1, l2_regularization_strength=-1.),
       "l2_regularization_strength must be greater than or equal to 0. got -1.0."),
      (lambda: tpu_embedding.MomentumParameters(0.1, 0.9, use_gradient_accumulation=False,
                                                clip_gradient_max=1.0),
       "When using gradient clipping limits, gradient  accumulation must be enabled."),
  ]
  for build, message in refusals:
    with pytest.raises(ValueError) as raised:
      build()
    assert str(raised.value) == message


def _spec_from_dicts(**spec_kwargs):
  return embedding_lib.EmbeddingConfigSpec(
      feature_to_config_dict={"x": tpu_embedding.FeatureConfig("t1"),
                              "y": tpu_embedding.FeatureConfig("t1", max_sequence_length=2)},
      table_to_config_dict={"t1": tpu_embedding.TableConfig(10, 2)},
      optimization_parameters=tpu_embedding.AdagradParameters(0.01), **spec_kwargs)


def test_embedding_config_spec_from_config_dicts_is_checked():
  spec = _spec_from_dicts(partition_strategy="mod")
  assert spec.partition_strategy == "mod"
  assert spec.feature_to_config_dict["y"].max_sequence_length == 2
  with pytest.raises(ValueError, match="Feature z refers to table t9 which is not in the"):
    embedding_lib.EmbeddingConfigSpec(
        feature_to_config_dict={"z": tpu_embedding.FeatureConfig("t9")},
        table_to_config_dict={"t1": tpu_embedding.TableConfig(10, 2)})
  with pytest.raises(TypeError, match="Config for table t1 must be of type `TableConfig`"):
    embedding_lib.EmbeddingConfigSpec(
        feature_to_config_dict={"x": tpu_embedding.FeatureConfig("t1")},
        table_to_config_dict={"t1": (10, 2)})


def _run_config(tmp_path):
  return tpu_config.RunConfig(master="", model_dir=str(tmp_path),
                              tpu_config=tpu_config.TPUConfig(iterations_per_loop=2, num_shards=8))


def test_a_feature_in_two_embeddings_is_refused_when_the_config_is_read(tmp_path):
  column = _identity("x", 10)
  spec = embedding_lib.EmbeddingConfigSpec(
      feature_columns=[tf.compat.v1.tpu.experimental.embedding_column(column, dimension=2),
                       tf.compat.v1.tpu.experimental.embedding_column(column, dimension=4)],
      optimization_parameters=tpu_embedding.AdagradParameters(0.01))
  with pytest.raises(ValueError, match="Feature column x is used with multiple embeddings"):
    embedding_lib.EmbeddingConfig(spec, 8, 8, 1, 8, _run_config(tmp_path))


def test_the_tpu_embedding_engine_is_what_is_refused(tmp_path):
  config = embedding_lib.EmbeddingConfig(_spec_from_dicts(), 8, 8, 1, 8, _run_config(tmp_path))
  assert config.has_embedding_tables()
  if STANDIN:
    with pytest.raises(_refusal.UnavailableOnThisStack,
                       match=r"TPU embeddings \(TPUEstimator's embedding_config_spec\): "
                             r"tpu_embedding\.TPUEmbedding is not available on TensorFlow "
                             r"2\.\d+.*tf2\.15 stack"):
      config.get_tpu_embedding("train")
  else:  # TF 2.15's own TPUEmbedding asks the (absent) TPU for its cores.
    with pytest.raises(ValueError, match="TPUEmbedding needs TPUs, but master  does not have"):
      config.get_tpu_embedding("train")


def test_tpu_estimator_with_embedding_spec_trains_on_cpu(tmp_path):
  column = tf.compat.v1.tpu.experimental.embedding_column(_identity("x", 10), dimension=2)
  spec = tpu_estimator.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=tpu_estimator.AdagradParameters(learning_rate=0.01))

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.keras.layers.DenseFeatures([column])(features)
    loss = tf.compat.v1.losses.mean_squared_error(labels, tf.compat.v1.layers.dense(net, 1))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tpu_estimator.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def input_fn(params):
    size = params["batch_size"]
    ids = tf.sparse.SparseTensor([[i, 0] for i in range(size)], list(range(size)), [size, 1])
    return tf.data.Dataset.from_tensors(({"x": ids}, np.ones([size, 1], np.float32))).repeat()

  estimator = tpu_estimator.TPUEstimator(
      model_fn=model_fn, config=_run_config(tmp_path), train_batch_size=8, use_tpu=False,
      embedding_config_spec=spec)
  estimator.train(input_fn, steps=3)
  assert estimator.get_variable_value("global_step") == 3
  tables = [name for name in estimator.get_variable_names() if name.endswith("embedding_weights")]
  assert [estimator.get_variable_value(name).shape for name in tables] == [(10, 2)]
