"""model_fn: a spec per mode, transpose undone, batch-norm updates, no CrossReplicaSum off TPU."""

from conftest import tiny_config
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.model import model_fn as model_fn_lib

ModeKeys = stacks.ModeKeys


def _params(tmp_path, **overrides):
  params = tiny_config(tmp_path).to_params()
  params.update(use_tpu=False, batch_size=4, class_names=[str(i) for i in range(10)])
  params.update(overrides)
  return params


def _images(batch=4, size=32, seed=0):
  return np.random.default_rng(seed).normal(size=(batch, size, size, 3)).astype(np.float32)


def _spec(mode, params, features=None, labels=None):
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(7)
    if features is None:
      features = {"image": tf.constant(_images())}
    elif callable(features):
      features = features()
    if labels is None and mode != ModeKeys.PREDICT:
      labels = tf.constant([1, 2, 3, 4], tf.int32)
    spec = model_fn_lib.model_fn(features, labels, mode, params)
  return graph, spec


@pytest.mark.parametrize("mode", [ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT])
def test_every_mode_returns_a_tpu_estimator_spec(tmp_path, mode):
  _, spec = _spec(mode, _params(tmp_path))
  assert isinstance(spec, stacks.tpu.TPUEstimatorSpec)
  assert spec.mode == mode
  if mode == ModeKeys.TRAIN:
    assert spec.train_op is not None and spec.host_call is not None
  if mode == ModeKeys.EVAL:
    metric_fn, tensors = spec.eval_metrics
    assert callable(metric_fn) and len(tensors) == 3
  if mode == ModeKeys.PREDICT:
    assert set(spec.predictions) == {"probabilities", "classid", "class"}
    assert spec.predictions["probabilities"].shape.as_list() == [4, 10]
    assert "serving_default" in spec.export_outputs


def test_predict_on_tpu_has_no_string_output(tmp_path):
  _, spec = _spec(ModeKeys.PREDICT, _params(tmp_path, use_tpu=True))
  assert set(spec.predictions) == {"probabilities", "classid"}


def test_features_may_be_a_plain_tensor(tmp_path):
  _, spec = _spec(ModeKeys.PREDICT, _params(tmp_path), features=lambda: tf.constant(_images()))
  assert spec.predictions["classid"].shape.as_list() == [4]


def _train_loss(params, images, checkpoint, save):
  """Loss of one TRAIN-mode model_fn call; weights saved to or restored from checkpoint."""
  graph = tf.Graph()
  with graph.as_default():
    labels = tf.constant([1, 2, 3, 4], tf.int32)
    spec = model_fn_lib.model_fn({"image": tf.constant(images)}, labels,
                                 ModeKeys.TRAIN, params)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      if save:
        session.run(tf.compat.v1.global_variables_initializer())
        saver.save(session, checkpoint)
      else:
        saver.restore(session, checkpoint)
      return session.run(spec.loss)


def test_transposed_and_plain_training_give_the_same_loss(tmp_path):
  images = _images()
  checkpoint = str(tmp_path / "init")
  plain = _train_loss(_params(tmp_path), images, checkpoint, save=True)
  hwcn = np.transpose(images, [1, 2, 3, 0])
  transposed = _train_loss(_params(tmp_path, transpose_input=True), hwcn, checkpoint,
                           save=False)
  assert np.isfinite(plain) and plain > 0
  np.testing.assert_allclose(plain, transposed, rtol=1e-6)


def test_batch_norm_updates_run_with_the_train_op(tmp_path):
  graph, spec = _spec(ModeKeys.TRAIN, _params(tmp_path))
  with graph.as_default():
    updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    moving = [v for v in tf.compat.v1.global_variables() if "moving_mean" in v.name]
    assert len(updates) == 2 and len(moving) == 1
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      before = session.run(moving[0])
      session.run(spec.train_op)
      after = session.run(moving[0])
  assert not np.allclose(before, after)


def test_cpu_graph_has_no_cross_replica_sum(tmp_path):
  graph, _ = _spec(ModeKeys.TRAIN, _params(tmp_path))
  op_types = {op.type for op in graph.get_operations()}
  assert "CrossReplicaSum" not in op_types
  assert "ApplyMomentum" in op_types or "ResourceApplyMomentum" in op_types


def test_weight_decay_skips_batch_norm(tmp_path):
  graph, _ = _spec(ModeKeys.TRAIN, _params(tmp_path))
  with graph.as_default():
    l2_inputs = {op.inputs[0].op.name for op in graph.get_operations() if op.type == "L2Loss"}
  assert l2_inputs and not any("batch_normalization" in name for name in l2_inputs)


def test_transpose_helpers_are_inverse():
  images = tf.constant(_images(batch=2, size=5))
  back = input_pipeline.transpose_from_hwcn(input_pipeline.transpose_to_hwcn(images))
  np.testing.assert_array_equal(back, images)
