"""The networks: ResNet-18/34/50 parameter counts against the published ones, a training step."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu.model import networks

# Trainable parameters of the ImageNet models (1000 classes) as published with
# torchvision's reference implementations (He et al. 2016, v1.5).
PUBLISHED = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032}


def _count(weights):
  return sum(int(np.prod(w.shape)) for w in weights)


@pytest.mark.parametrize("depth", sorted(PUBLISHED))
def test_resnet_parameter_count_matches_the_published_figure(depth):
  net = networks.ResNet(1000, depth)
  logits = net(np.zeros((1, 64, 64, 3), np.float32))
  assert logits.shape == (1, 1000)
  assert _count(net.trainable_weights) == PUBLISHED[depth]


def test_resnet_depth_must_be_known():
  with pytest.raises(ValueError, match=r"resnet depth=101 is not one of \[18, 34, 50\]"):
    networks.ResNet(10, 101)


def test_one_training_step_moves_every_weight_and_lowers_the_loss():
  tf.keras.utils.set_random_seed(0)
  net = networks.build_network({"model": "resnet", "resnet_depth": 18, "image_size": 32,
                                "num_label_classes": 4, "dropout_rate": 0.0})
  images = tf.random.stateless_uniform((4, 32, 32, 3), seed=(1, 2))
  labels = tf.constant([0, 1, 2, 3])
  optimizer = tf.keras.optimizers.SGD(0.01)

  def loss_value():
    logits = net(images, training=True)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

  before = None
  for _ in range(5):
    with tf.GradientTape() as tape:
      loss = loss_value()
    before = float(loss) if before is None else before
    grads = tape.gradient(loss, net.trainable_weights)
    assert all(g is not None for g in grads)
    optimizer.apply_gradients(zip(grads, net.trainable_weights))
  assert float(loss_value()) < before


@pytest.mark.parametrize("name,size", [("flowers", 64), ("tiny", 32)])
def test_other_networks_give_one_logit_per_class(name, size):
  net = networks.build_network({"model": name, "image_size": size, "num_label_classes": 7,
                                "dropout_rate": 0.0})
  assert net(np.zeros((2, size, size, 3), np.float32)).shape == (2, 7)
