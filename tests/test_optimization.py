"""Learning-rate schedules against values computed by hand; optimizer choice; weight decay."""

import math

import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu.model import optimization

BASE = {"base_learning_rate": 0.1, "train_batch_size": 512, "train_steps": 1000,
        "warmup_steps": 0, "optimizer": "momentum", "momentum": 0.9}
PEAK = 0.1 * 512 / 256  # 0.2


def _lr(step, **changes):
  params = dict(BASE, **changes)
  return float(optimization.learning_rate(tf.constant(step, tf.int64), params))


def test_constant_is_the_scaled_peak():
  assert [_lr(s, lr_schedule="constant") for s in (0, 500, 999)] == pytest.approx([PEAK] * 3)


@pytest.mark.parametrize("step,expected", [(0, PEAK), (250, PEAK * (2 + math.sqrt(2)) / 4),
                                           (500, PEAK / 2), (1000, 0.0), (2000, 0.0)])
def test_cosine(step, expected):
  assert _lr(step, lr_schedule="cosine") == pytest.approx(expected, abs=1e-7)


# Boundaries at 30/60/80% of 1000 steps; a boundary step still has the old value.
@pytest.mark.parametrize("step,expected", [(0, 0.2), (300, 0.2), (301, 0.02), (600, 0.02),
                                           (601, 0.002), (800, 0.002), (801, 0.0002),
                                           (999, 0.0002)])
def test_step_decay_at_30_60_80_percent(step, expected):
  assert _lr(step, lr_schedule="step") == pytest.approx(expected, rel=1e-5)


def test_linear_warmup_then_cosine_from_the_end_of_warmup():
  values = [_lr(s, lr_schedule="cosine", warmup_steps=100) for s in (0, 50, 100, 550, 1000)]
  assert values == pytest.approx([0.0, PEAK / 2, PEAK, PEAK / 2, 0.0], abs=1e-7)


def test_unknown_schedule_and_optimizer_are_named():
  with pytest.raises(ValueError, match="unknown lr_schedule 'linear'"):
    _lr(0, lr_schedule="linear")
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'; use momentum or adam"):
    optimization.make_optimizer(0.1, dict(BASE, optimizer="sgd"))


def test_optimizer_is_wrapped_for_tpu_only():
  with tf.Graph().as_default():
    cpu = optimization.make_optimizer(0.1, dict(BASE, use_tpu=False))
    tpu = optimization.make_optimizer(0.1, dict(BASE, use_tpu=True))
    adam = optimization.make_optimizer(0.1, dict(BASE, optimizer="adam"))
  assert type(cpu) is tf.compat.v1.train.MomentumOptimizer and cpu._use_nesterov
  assert type(tpu) is tf.compat.v1.tpu.CrossShardOptimizer
  assert type(adam) is tf.compat.v1.train.AdamOptimizer


def test_weight_decay_skips_batch_norm_and_biases():
  with tf.Graph().as_default():
    kernel = tf.compat.v1.get_variable("dense/kernel", initializer=[[1.0, 2.0], [3.0, 4.0]])
    bias = tf.compat.v1.get_variable("dense/bias", initializer=[5.0, 6.0])
    gamma = tf.compat.v1.get_variable("batch_normalization/gamma", initializer=[7.0])
    loss = optimization.weight_decay_loss([kernel, bias, gamma], 1e-2)
    none = optimization.weight_decay_loss([kernel], 0.0)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      value, zero = session.run([loss, none])
  # 1e-2 x l2_loss(kernel) = 1e-2 x (1 + 4 + 9 + 16) / 2
  np.testing.assert_allclose(value, 0.15, rtol=1e-6)
  assert zero == 0.0
