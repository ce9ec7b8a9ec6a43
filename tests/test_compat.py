"""Tests of estimator_tpu.compat: the tf.contrib names legacy TPU code uses."""

import importlib
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as real_tf

from estimator_tpu import stacks
from estimator_tpu.compat import _lazy
from estimator_tpu.compat import _util
from estimator_tpu.compat import registry
from estimator_tpu.compat import tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIGRATING = os.path.join(REPO, "docs", "MIGRATING.md")


def _table_rows(path=MIGRATING):
  """(name, target cell, kind, notes) of every row under a registry table header."""
  rows, in_table = [], False
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line == registry.TABLE_HEADER:
        in_table = True
      elif not line.startswith("|"):
        in_table = False
      elif in_table and not line.startswith("|---"):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2],
                     cells[3] if len(cells) > 3 else ""))
  return rows


DOC_ROWS = _table_rows()


def _resolve(name):
  value = tf
  for part in name.split(".")[1:]:
    value = getattr(value, part)
  return value


# --- the module itself ---------------------------------------------------------


def test_import_does_not_import_tensorflow():
  code = ("import sys, estimator_tpu.compat; "
          "print('tensorflow' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, cwd=REPO)
  assert out.stdout.strip() == "False"


def test_falls_through_to_compat_v1():
  assert tf.layers.dense is real_tf.compat.v1.layers.dense
  assert tf.train.MomentumOptimizer is real_tf.compat.v1.train.MomentumOptimizer
  assert tf.app.flags is real_tf.compat.v1.app.flags
  assert tf.__version__ == real_tf.__version__
  assert "contrib" in dir(tf) and "Session" in dir(tf)


def test_missing_v1_name_points_to_the_doc():
  with pytest.raises(AttributeError, match="MIGRATING.md"):
    tf.no_such_name  # noqa: B018 -- the attribute access is what raises


@pytest.mark.parametrize("name", ["tf.contrib.nonexistent",
                                  "tf.contrib.tpu.NoSuchThing",
                                  "tf.contrib.data.no_such_fn"])
def test_unknown_contrib_name_is_a_helpful_attribute_error(name):
  with pytest.raises(AttributeError) as err:
    _resolve(name)
  assert name in str(err.value) and "docs/MIGRATING.md" in str(err.value)
  parent, _, leaf = name.rpartition(".")
  assert not hasattr(_resolve(parent), leaf)


# --- docs/MIGRATING.md ---------------------------------------------------------


def test_migrating_table_matches_registry():
  documented = [(name, kind) for name, _, kind, _ in DOC_ROWS]
  registered = [(name, entry.kind) for name, entry in registry.rows()]
  assert sorted(documented) == sorted(registered)
  assert len(documented) == len(set(documented))
  assert {kind for _, kind in documented} == set(_lazy.KINDS)


@pytest.mark.parametrize(
    "name,target", [(n, t) for n, t, k, _ in DOC_ROWS if k != _lazy.REFUSED])
def test_every_mapped_or_reimplemented_name_resolves(name, target):
  entry = dict(registry.rows())[name]
  assert _lazy.display_target(entry.target) == target
  value = _resolve(name)
  if target.startswith("tf."):  # found again through the real tensorflow, not the loader
    expected, parts = real_tf, target.split(".")[1:]
    if target.startswith("tf.compat.v1.estimator."):  # TF >= 2.16 has no tf.estimator
      expected, parts = stacks.estimator, parts[3:]
    for part in parts:
      expected = getattr(expected, part)
    assert value is expected
  elif "." not in target:  # a whole module (tf.contrib.slim is tf_slim)
    assert value is importlib.import_module(target)
  else:  # a module path: the object is defined in (or re-exported by) that module
    module_name, _, attribute = target.rpartition(".")
    assert value is getattr(importlib.import_module(module_name), attribute)
  if entry.kind == _lazy.REIMPLEMENTED and callable(value):
    assert getattr(value, "__module__", "").startswith("estimator_tpu.compat")


@pytest.mark.parametrize(
    "name,notes", [(n, x) for n, _, k, x in DOC_ROWS if k == _lazy.REFUSED])
def test_every_refused_name_says_what_to_use_instead(name, notes):
  with pytest.raises(AttributeError) as err:
    _resolve(name)
  message = str(err.value)
  assert name in message and "docs/MIGRATING.md" in message
  assert notes and notes.replace("\\|", "|") in message


def test_export_savedmodel_alias_exists():
  assert callable(tf.contrib.tpu.TPUEstimator.export_savedmodel)


# --- tf.contrib.tpu.CrossShardOptimizer ----------------------------------------


def _quadratic_graph(optimizer_fn):
  """loss = (w - 1)^2 with w = 3: gradient 4 at the start."""
  graph = tf.Graph()
  with graph.as_default():
    w = tf.get_variable("w", [], initializer=tf.constant_initializer(3.0))
    loss = tf.square(w - 1.0)
    global_step = tf.train.get_or_create_global_step()
    train_op = optimizer_fn(loss, global_step)
  return graph, w, loss, global_step, train_op


def test_cross_shard_optimizer_off_tpu_trains_like_the_wrapped_one():
  def build(loss, global_step):
    opt = tf.contrib.tpu.CrossShardOptimizer(
        tf.train.GradientDescentOptimizer(0.1))
    assert isinstance(opt, real_tf.compat.v1.tpu.CrossShardOptimizer)
    return opt.minimize(loss, global_step)
  graph, w, loss, _, train_op = _quadratic_graph(build)
  op_types = {op.type for op in graph.get_operations()}
  assert "CrossReplicaSum" not in op_types
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    sess.run(train_op)
    assert sess.run(w) == pytest.approx(3.0 - 0.1 * 4.0)
    losses = [sess.run([train_op, loss])[1] for _ in range(5)]
  assert losses == sorted(losses, reverse=True) and losses[-1] < 0.5


def test_cross_shard_optimizer_notes_once_at_info(caplog):
  _util._noted.discard("CrossShardOptimizer")
  with caplog.at_level(logging.INFO):
    for _ in range(2):
      _quadratic_graph(lambda loss, step: tf.contrib.tpu.CrossShardOptimizer(
          tf.train.GradientDescentOptimizer(0.1)).minimize(loss, step))
  messages = [r.getMessage() for r in caplog.records
              if "CrossShardOptimizer" in r.getMessage()]
  assert len(messages) == 1 and "GradientDescentOptimizer" in messages[0]
  assert [r.levelname for r in caplog.records if "CrossShardOptimizer" in r.getMessage()] == [
      "INFO"]


def _build_in_tpu_rewrite(computation):
  graph = tf.Graph()
  with graph.as_default():
    tf.tpu.rewrite(computation, [tf.constant(2.0)])
  return {op.type for op in graph.get_operations()}


def test_cross_shard_optimizer_inside_tpu_computation_emits_cross_replica_sum():
  def computation(x):
    w = tf.get_variable("w", [], initializer=tf.constant_initializer(1.0))
    opt = tf.contrib.tpu.CrossShardOptimizer(
        tf.train.GradientDescentOptimizer(0.1))
    return opt.minimize(tf.square(w * x))
  op_types = _build_in_tpu_rewrite(computation)
  assert "CrossReplicaSum" in op_types and "TPUReplicateMetadata" in op_types


# --- tf.contrib.tpu.TPUEstimatorSpec -------------------------------------------


def test_estimator_spec_with_metric_dict_inside_tpu_computation_says_what_to_do():
  def computation(x):
    labels = tf.constant([1, 0])
    metrics = {"accuracy": tf.metrics.accuracy(labels, labels)}
    tf.contrib.tpu.TPUEstimatorSpec(mode=tf.estimator.ModeKeys.EVAL,
                                    loss=x, eval_metrics=metrics)
    return x
  with pytest.raises(ValueError, match=r"\(metric_fn, \[labels, logits\]\)"):
    _build_in_tpu_rewrite(computation)


def _linear_model_fn(features, labels, mode, params):
  del params
  logits = tf.layers.dense(features, 2, name="logits")
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.contrib.tpu.CrossShardOptimizer(
      tf.train.GradientDescentOptimizer(0.5)).minimize(
          loss, tf.train.get_global_step())
  predictions = tf.argmax(logits, 1, output_type=tf.int32)
  metrics = {"accuracy": tf.metrics.accuracy(labels, predictions)}
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                         eval_metrics=metrics)


def test_estimator_spec_with_metric_dict_evaluates_off_tpu(tmp_path):
  x = np.concatenate([np.full((32, 1), -1.0), np.full((32, 1), 1.0)])
  y = np.concatenate([np.zeros(32), np.ones(32)]).astype(np.int32)

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((x.astype(np.float32), y))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)

  config = tf.contrib.tpu.RunConfig(
      cluster=tf.contrib.cluster_resolver.TPUClusterResolver(None),
      model_dir=str(tmp_path))
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=_linear_model_fn, config=config, use_tpu=False,
      train_batch_size=16, eval_batch_size=16)
  estimator.train(input_fn, max_steps=20)
  results = estimator.evaluate(input_fn, steps=4)
  assert results["accuracy"] == 1.0


# --- tf.contrib.cluster_resolver.TPUClusterResolver ----------------------------


@pytest.mark.parametrize("tpu", [None, ""])
def test_cluster_resolver_without_tpu_is_local(tpu, monkeypatch):
  for var in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG"):
    monkeypatch.delenv(var, raising=False)
  resolver = tf.contrib.cluster_resolver.TPUClusterResolver(tpu)
  assert resolver.master() == "" and resolver.get_master() == ""
  config = tf.contrib.tpu.RunConfig(cluster=resolver)
  assert config.master == ""
  assert not config.session_config.HasField("cluster_def")


# --- tf.contrib.data -----------------------------------------------------------


def test_data_transformations_keep_static_batch_shapes():
  dataset = tf.data.Dataset.range(10).apply(tf.contrib.data.map_and_batch(
      lambda i: (tf.fill([2], tf.cast(i, tf.float32)), i), batch_size=4,
      drop_remainder=True))
  assert dataset.element_spec[0].shape == (4, 2)
  assert [b[1].numpy().tolist() for b in dataset] == [[0, 1, 2, 3],
                                                      [4, 5, 6, 7]]
  dropped = tf.data.Dataset.range(10).apply(
      tf.contrib.data.batch_and_drop_remainder(3))
  assert dropped.element_spec.shape == (3,) and len(list(dropped)) == 3
  padded = tf.data.Dataset.range(1, 6).map(lambda n: tf.range(n)).apply(
      tf.contrib.data.padded_batch_and_drop_remainder(2, [None]))
  assert [b.shape[0] for b in padded] == [2, 2]


def test_shuffle_and_repeat_and_parallel_interleave():
  dataset = tf.data.Dataset.range(3).apply(
      tf.contrib.data.parallel_interleave(
          lambda i: tf.data.Dataset.from_tensors(i).repeat(2), cycle_length=3))
  assert sorted(x.numpy() for x in dataset) == [0, 0, 1, 1, 2, 2]
  repeated = tf.data.Dataset.range(4).apply(
      tf.contrib.data.shuffle_and_repeat(4, count=2, seed=1))
  assert sorted(x.numpy() for x in repeated) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_assert_element_shape_checks_at_run_time():
  dataset = tf.data.Dataset.from_generator(
      lambda: iter([np.zeros(3), np.zeros(2)]), tf.float64).apply(
          tf.contrib.data.assert_element_shape(tf.TensorShape([3])))
  assert dataset.element_spec.shape == (3,)
  iterator = iter(dataset)
  next(iterator)
  with pytest.raises(real_tf.errors.InvalidArgumentError):
    next(iterator)


# --- tf.contrib.lookup ---------------------------------------------------------


def test_index_table_from_tensor_eager():
  table = tf.contrib.lookup.index_table_from_tensor(
      mapping=["a", "b"], num_oov_buckets=1)
  assert table.lookup(tf.constant(["a", "b", "zz"])).numpy().tolist() == [
      0, 1, 2]
  no_oov = tf.contrib.lookup.index_table_from_tensor(tf.constant(["a", "b"]))
  ids = no_oov.lookup(tf.constant(["b", "zz"]))
  assert ids.dtype == tf.int64 and ids.numpy().tolist() == [1, -1]


def test_index_tables_in_graph_mode_need_tables_initializer():
  graph = tf.Graph()
  with graph.as_default():
    table = tf.contrib.lookup.index_table_from_tensor(
        ["emerson", "lake", "palmer"], num_oov_buckets=1, default_value=-1)
    ids = table.lookup(tf.constant(["emerson", "lake", "and", "palmer"]))
    names = tf.contrib.lookup.index_to_string_table_from_tensor(
        mapping=["x", "y"]).lookup(tf.constant([1, 5], tf.int64))
    with tf.Session() as sess:
      sess.run(tf.tables_initializer())
      assert sess.run(ids).tolist() == [0, 1, 3, 2]
      assert sess.run(names).tolist() == [b"y", b"UNK"]


def test_index_table_rejects_both_argument_names():
  with pytest.raises(ValueError, match="exactly one of `mapping`"):
    tf.contrib.lookup.index_table_from_tensor(["a"], vocabulary_list=["a"])


# --- tf.contrib.training.HParams -----------------------------------------------


def test_hparams_parse_coerces_to_the_existing_type():
  hparams = tf.contrib.training.HParams(
      learning_rate=0.1, num_layers=2, optimizer="sgd", use_bn=False,
      sizes=[1, 2])
  hparams.parse("learning_rate=1,num_layers=3,optimizer=adam,use_bn=true,"
                "sizes=[4,5,6]")
  assert hparams.learning_rate == 1.0 and isinstance(hparams.learning_rate,
                                                     float)
  assert (hparams.num_layers, hparams.optimizer, hparams.use_bn) == (
      3, "adam", True)
  assert hparams.sizes == [4, 5, 6]


@pytest.mark.parametrize("text,match", [
    ("num_layers=1.5", "Could not parse hparam 'num_layers'"),
    ("nope=1", "Unknown hyperparameter type for nope"),
    ("num_layers=1,num_layers=2", "Multiple assignments"),
    ("sizes[0]=3", "not supported"),
    ("==", "Malformed"),
])
def test_hparams_parse_errors(text, match):
  hparams = tf.contrib.training.HParams(num_layers=2, sizes=[1])
  with pytest.raises(ValueError, match=re.escape(match)):
    hparams.parse(text)


def test_hparams_api():
  hparams = tf.contrib.training.HParams(batch_size=8, name="x")
  hparams.add_hparam("dropout", 0.5)
  with pytest.raises(ValueError, match="reserved"):
    hparams.add_hparam("dropout", 0.1)
  with pytest.raises(ValueError, match="reserved"):
    hparams.add_hparam("values", 1)
  hparams.set_hparam("batch_size", 16)
  with pytest.raises(ValueError, match="Could not cast"):
    hparams.set_hparam("batch_size", "16")
  with pytest.raises(KeyError):
    hparams.set_hparam("missing", 1)
  hparams.override_from_dict({"dropout": 1})
  assert hparams.dropout == 1.0 and isinstance(hparams.dropout, float)
  assert hparams.values() == {"batch_size": 16, "name": "x", "dropout": 1.0}
  assert json.loads(hparams.to_json()) == hparams.values()
  other = tf.contrib.training.HParams(batch_size=1, name="", dropout=0.0)
  assert other.parse_json(hparams.to_json()).values() == hparams.values()
  assert "dropout" in hparams and "nope" not in hparams
  assert hparams.get("nope", 3) == 3 and hparams.get("batch_size", 1) == 16
  with pytest.raises(ValueError, match="incompatible"):
    hparams.get("batch_size", "one")


# --- tf.contrib.layers.optimize_loss -------------------------------------------


def _run_optimize_loss(steps=1, **kwargs):
  """Runs optimize_loss on (w - 1)^2 from w = 3; returns (values, w, step)."""
  def build(loss, global_step):
    return tf.contrib.layers.optimize_loss(loss, global_step, **kwargs)
  graph, w, _, global_step, train_op = _quadratic_graph(build)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    values = [sess.run(train_op) for _ in range(steps)]
    return values, sess.run(w), sess.run(global_step)


def test_optimize_loss_one_sgd_step():
  values, w, step = _run_optimize_loss(learning_rate=0.1, optimizer="SGD")
  assert values == [pytest.approx(4.0)]  # the loss before the update
  assert w == pytest.approx(3.0 - 0.1 * 4.0) and step == 1


@pytest.mark.parametrize("optimizer", [
    lambda: "SGD",
    lambda: tf.train.GradientDescentOptimizer,
    lambda: tf.train.GradientDescentOptimizer(0.1),
    lambda: (lambda lr: tf.train.GradientDescentOptimizer(lr)),
])
def test_optimize_loss_optimizer_forms(optimizer):
  _, w, _ = _run_optimize_loss(learning_rate=0.1, optimizer=optimizer())
  assert w == pytest.approx(2.6)


def test_optimize_loss_clips_the_global_norm():
  _, w, _ = _run_optimize_loss(learning_rate=0.1, optimizer="SGD",
                               clip_gradients=1.0)
  assert w == pytest.approx(3.0 - 0.1 * 1.0)


def test_optimize_loss_names_and_summaries():
  graph = tf.Graph()
  with graph.as_default():
    w = tf.get_variable("w", [], initializer=tf.constant_initializer(3.0))
    tf.contrib.layers.optimize_loss(
        tf.square(w), tf.train.get_or_create_global_step(), 0.1, "Momentum")
    names = [v.op.name for v in tf.global_variables()]
    summaries = [s.op.name for s in tf.get_collection(tf.GraphKeys.SUMMARIES)]
  assert "OptimizeLoss/learning_rate" in names
  assert any("Momentum" in n for n in names)
  assert any("global_norm/gradient_norm" in s for s in summaries)
  assert any(s.endswith("loss") for s in summaries)
  with graph.as_default(), pytest.raises(ValueError, match="Summaries"):
    tf.contrib.layers.optimize_loss(tf.square(w), None, 0.1, "SGD",
                                    summaries=["nope"])
  with graph.as_default(), pytest.raises(ValueError, match="Optimizer name"):
    tf.contrib.layers.optimize_loss(tf.square(w), None, 0.1, "Nope")


def test_optimize_loss_runs_update_ops_first():
  def build(loss, global_step):
    counter = tf.get_variable("counter", [], trainable=False,
                              initializer=tf.zeros_initializer())
    tf.add_to_collection(tf.GraphKeys.UPDATE_OPS, counter.assign_add(1.0))
    return tf.contrib.layers.optimize_loss(loss, global_step, 0.1, "SGD"), (
        counter)
  graph, _, _, _, (train_op, counter) = _quadratic_graph(build)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    sess.run(train_op)
    assert sess.run(counter) == 1.0


# --- tf.contrib.layers: layer_norm, initializers, regularizers -----------------


def test_layer_norm_keeps_tf1_variable_names_and_normalizes():
  graph = tf.Graph()
  with graph.as_default():
    inputs = tf.constant(np.arange(12, dtype=np.float32).reshape(2, 2, 3))
    outputs = tf.contrib.layers.layer_norm(inputs, begin_norm_axis=-1,
                                           begin_params_axis=-1)
    names = sorted(v.op.name for v in tf.trainable_variables())
    model_vars = tf.get_collection(tf.GraphKeys.MODEL_VARIABLES)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      values = sess.run(outputs)
  assert names == ["LayerNorm/beta", "LayerNorm/gamma"] and len(model_vars) == 2
  assert np.allclose(values.mean(axis=-1), 0.0, atol=1e-5)
  assert np.allclose(values.std(axis=-1), 1.0, atol=1e-3)


def test_initializers_and_regularizers_use_tf1_formulas():
  shape = [3, 3, 64, 32]
  fan_in = 3 * 3 * 64
  values = tf.contrib.layers.variance_scaling_initializer(uniform=True)(shape)
  assert np.abs(values.numpy()).max() <= np.sqrt(3.0 * 2.0 / fan_in)
  normal = tf.contrib.layers.variance_scaling_initializer(seed=1)(shape)
  assert np.std(normal.numpy()) == pytest.approx(
      np.sqrt(1.3 * 2.0 / fan_in) * 0.88, rel=0.05)
  weights = tf.constant([1.0, -2.0])
  assert tf.contrib.layers.l2_regularizer(0.1)(weights).numpy() == (
      pytest.approx(0.1 * 5.0 / 2))
  assert tf.contrib.layers.l1_regularizer(0.1)(weights).numpy() == (
      pytest.approx(0.3))
  with pytest.raises(ValueError, match="integer"):
    tf.contrib.layers.l2_regularizer(1)


# --- tf.contrib.summary, as in tensorflow/tpu resnet's host_call ---------------


def test_contrib_summary_host_call_pattern_writes_events(tmp_path):
  graph = tf.Graph()
  with graph.as_default():
    step = tf.constant([7], tf.int64)
    loss = tf.constant([0.5])
    with tf.contrib.summary.create_file_writer(
        str(tmp_path), max_queue=10).as_default():
      with tf.contrib.summary.always_record_summaries():
        tf.contrib.summary.scalar("loss", loss[0], step=step[0])
        ops = tf.contrib.summary.all_summary_ops()
      flush = tf.contrib.summary.flush()
    with tf.Session() as sess:
      # What TPUEstimator's CPU host_call hook runs before the first step.
      sess.run(tf.contrib.summary.summary_writer_initializer_op())
      sess.run(ops)
      sess.run(flush)
  events = [e for path in tmp_path.iterdir()
            for e in tf.train.summary_iterator(str(path))]
  tagged = [(e.step, v.tag) for e in events for v in e.summary.value]
  assert (7, "loss") in tagged


def test_contrib_summary_writer_made_in_a_loop_starts_before_it(tmp_path):
  # Off TPU our host loop runs the host_call inside a while loop; the writer's
  # initializer must be runnable before the loop's first step.
  graph = tf.Graph()
  with graph.as_default():
    def body(step):
      with tf.contrib.summary.create_file_writer(str(tmp_path)).as_default():
        with tf.contrib.summary.always_record_summaries():
          tf.contrib.summary.scalar("step", tf.cast(step, tf.float32), step=step)
          ops = tf.contrib.summary.all_summary_ops()
      with tf.control_dependencies(ops):
        return step + 1

    loop = tf.while_loop(lambda step: step < 3, body, [tf.constant(0, tf.int64)])
    init = tf.contrib.summary.summary_writer_initializer_op()
    assert len(init) == 1 and init[0].graph is graph
    with tf.Session() as sess:
      sess.run(init)
      assert sess.run(loop) == 3
      sess.run([tf.contrib.summary.flush(writer=op.inputs[0]) for op in init])
  events = [e for path in tmp_path.iterdir() for e in tf.train.summary_iterator(str(path))]
  assert sorted(e.step for e in events if e.summary.value) == [0, 1, 2]
