"""Weighted streaming metrics agree with scikit-learn and ignore weight-0 padding."""

import numpy as np
from sklearn import metrics as sk_metrics
import tensorflow as tf

from estimator_tpu.model import metrics


def _run(labels, logits, weights, num_classes, batches=3):
  graph = tf.Graph()
  with graph.as_default():
    labels_ph = tf.compat.v1.placeholder(tf.int32, [None])
    logits_ph = tf.compat.v1.placeholder(tf.float32, [None, num_classes])
    weights_ph = tf.compat.v1.placeholder(tf.float32, [None])
    ops = metrics.classification_metrics(labels_ph, logits_ph, weights_ph, num_classes)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      for chunk in np.array_split(np.arange(len(labels)), batches):
        session.run({k: v[1] for k, v in ops.items()},
                    {labels_ph: labels[chunk], logits_ph: logits[chunk],
                     weights_ph: weights[chunk]})
      return session.run({k: v[0] for k, v in ops.items()})


def test_metrics_match_sklearn_on_real_examples_and_ignore_padding():
  rng = np.random.default_rng(3)
  num_classes, real, padding = 7, 50, 14
  labels = rng.integers(0, num_classes, real + padding).astype(np.int32)
  logits = rng.normal(size=(real + padding, num_classes)).astype(np.float32)
  logits[np.arange(real), labels[:real]] += rng.normal(1.0, 1.0, real)  # some skill
  weights = np.r_[np.ones(real), np.zeros(padding)].astype(np.float32)
  result = _run(labels, logits, weights, num_classes)

  y_true, y_pred = labels[:real], logits[:real].argmax(1)
  assert result["num_eval_examples"] == real
  np.testing.assert_allclose(result["accuracy"], sk_metrics.accuracy_score(y_true, y_pred),
                             rtol=1e-6)
  np.testing.assert_allclose(result["macro_f1"],
                             sk_metrics.f1_score(y_true, y_pred, average="macro"), rtol=1e-5)
  np.testing.assert_allclose(result["mean_per_class_accuracy"],
                             sk_metrics.balanced_accuracy_score(y_true, y_pred), rtol=1e-5)
  top5 = np.mean([y in np.argsort(-row)[:5] for y, row in zip(y_true, logits[:real])])
  np.testing.assert_allclose(result["top_5_accuracy"], top5, rtol=1e-6)
  xent = -np.log(np.exp(logits[:real])[np.arange(real), y_true] /
                 np.exp(logits[:real]).sum(1))
  np.testing.assert_allclose(result["eval_loss"], xent.mean(), rtol=1e-5)


def test_top5_only_with_more_than_five_classes():
  labels = np.array([0, 1, 2], np.int32)
  logits = np.eye(3, dtype=np.float32)
  result = _run(labels, logits, np.ones(3, np.float32), 3, batches=1)
  assert "top_5_accuracy" not in result
  assert result["accuracy"] == 1.0
  assert result["macro_f1"] == 1.0
