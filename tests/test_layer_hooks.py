"""TF 1 layer subclasses that override private Keras hooks with their TF 1.15 signatures."""

import inspect

import numpy as np
import pytest

from estimator_tpu.compat import layer_hooks
from estimator_tpu.compat import tf


def _run(build):
  """Builds `build()` in a graph, runs it once; returns the numpy values."""
  with tf.Graph().as_default():
    tf.set_random_seed(1)
    outputs = build()
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      return session.run(outputs)


class MomentsAsTf1(tf.layers.BatchNormalization):
  """The cross-replica batch norm's override: (inputs, reduction_axes, keep_dims)."""

  def _moments(self, inputs, reduction_axes, keep_dims):
    self.seen = (len(reduction_axes), keep_dims)
    return super(MomentsAsTf1, self)._moments(inputs, reduction_axes, keep_dims=keep_dims)


class MeanAndVarAsTf1(tf.layers.BatchNormalization):

  def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims):
    self.seen = True
    return tf.nn.moments(inputs, reduction_axes, keepdims=keep_dims)


class FusedAsTf1(tf.layers.BatchNormalization):

  def _fused_batch_norm(self, inputs, training):
    self.seen = training
    return super(FusedAsTf1, self)._fused_batch_norm(inputs, mask=None, training=training)


class CausalAsTf1(tf.layers.Conv1D):

  def _compute_causal_padding(self):
    self.seen = True
    return [[0, 0], [self.dilation_rate[0] * (self.kernel_size[0] - 1), 0], [0, 0]]


def test_a_moments_override_with_the_tf_1_signature_normalizes_as_the_base_class():
  x = np.random.RandomState(0).normal(3.0, 2.0, size=(8, 4, 4, 3)).astype(np.float32)

  def build():
    ours = MomentsAsTf1(fused=False, name="ours")
    plain = tf.layers.BatchNormalization(fused=False, name="plain")
    return ours(tf.constant(x), training=True), plain(tf.constant(x), training=True), ours

  with tf.Graph().as_default():
    ours_out, plain_out, layer = build()
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      ours_value, plain_value = session.run([ours_out, plain_out])
  assert layer.seen == (3, False)  # called, with the TF 1 arguments
  np.testing.assert_allclose(ours_value, plain_value, atol=1e-5)
  np.testing.assert_allclose(ours_value.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)


@pytest.mark.parametrize("cls,kwargs", [(MeanAndVarAsTf1, {"fused": False}),
                                        (FusedAsTf1, {"fused": True})])
def test_the_other_batch_norm_hooks_take_their_tf_1_signatures(cls, kwargs):
  x = np.random.RandomState(1).normal(-1.0, 3.0, size=(4, 2, 2, 5)).astype(np.float32)
  layers = []

  def build():
    layer = cls(**kwargs)
    layers.append(layer)
    return layer(tf.constant(x), training=True)

  value = _run(build)
  assert getattr(layers[0], "seen", None) is not None
  np.testing.assert_allclose(value.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
  np.testing.assert_allclose(value.std(axis=(0, 1, 2)), 1.0, atol=1e-2)


def test_a_causal_padding_override_without_inputs_pads_on_the_left():
  layers = []

  def build():
    layer = CausalAsTf1(1, 3, padding="causal", use_bias=False,
                        kernel_initializer=tf.ones_initializer())
    layers.append(layer)
    return layer(tf.reshape(tf.range(1.0, 6.0), [1, 5, 1]))

  value = _run(build)
  assert layers[0].seen
  # Each output sums the input and the two before it (zeros on the left).
  np.testing.assert_allclose(value[0, :, 0], [1, 3, 6, 9, 12])


def test_a_mask_the_override_cannot_honour_is_refused_naming_the_class():
  layer = MomentsAsTf1(fused=False)
  with pytest.raises(TypeError, match=r"MomentsAsTf1\._moments overrides Keras' hook with its "
                                      r"TF 1 signature, which has no 'mask'"):
    layer._moments(tf.zeros([2, 3]), [0], keep_dims=False, mask=tf.ones([2]))


def test_overrides_that_take_the_new_arguments_and_unchanged_hooks_are_left_alone():

  class Current(tf.layers.BatchNormalization):

    def _moments(self, inputs, reduction_axes, keep_dims, mask=None):
      return super()._moments(inputs, reduction_axes, keep_dims, mask=mask)

    def _get_training_value(self, training=None):
      return super()._get_training_value(training)

  class Flexible(tf.layers.BatchNormalization):

    def _moments(self, *args, **kwargs):
      return super()._moments(*args, **kwargs)

  assert inspect.signature(Current._moments).parameters.keys() == {
      "self", "inputs", "reduction_axes", "keep_dims", "mask"}
  assert Current.__dict__["_moments"].__qualname__.endswith("Current._moments")
  assert Flexible.__dict__["_moments"].__qualname__.endswith("Flexible._moments")
  assert "_get_training_value" not in layer_hooks.HOOKS
  # The adapted one is a wrapper around the override.
  assert MomentsAsTf1.__dict__["_moments"].__wrapped__.__qualname__ == "MomentsAsTf1._moments"


def test_missing_arguments_reads_signatures_as_the_hooks_table_says():
  def tf1(self, inputs, reduction_axes, keep_dims):
    pass

  def tf2(self, inputs, reduction_axes, keep_dims, mask=None):
    pass

  def padding_tf1(self):
    pass

  params = lambda f: list(inspect.signature(f).parameters.values())[1:]  # noqa: E731
  assert [a.name for a in layer_hooks.missing_arguments(params(tf1), "_moments")] == ["mask"]
  assert layer_hooks.missing_arguments(params(tf2), "_moments") == []
  assert [a.name for a in layer_hooks.missing_arguments(
      params(padding_tf1), "_compute_causal_padding")] == ["inputs"]
