"""Weighted streaming metrics for metric_fn: accuracy, top-5, mean per-class accuracy, macro-F1.

Every metric takes per-example weights so weight-0 padding examples (added to
keep evaluation batches static on TPU) count for nothing.
"""

import tensorflow as tf


def _metric_variable(shape, name):
  # ON_READ/SUM like tf.compat.v1.metrics: under a MirroredStrategy each
  # replica accumulates its own copy and a cross-replica read sums them.
  return tf.compat.v1.get_local_variable(
      name, shape=shape, dtype=tf.float32, trainable=False,
      initializer=tf.compat.v1.zeros_initializer(),
      collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                   tf.compat.v1.GraphKeys.METRIC_VARIABLES],
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM)


def _across_replicas(value_fn, variable):
  """value_fn(variable) read in cross-replica context: one value, not one per replica."""
  return tf.distribute.get_replica_context().merge_call(
      lambda _, v: value_fn(v), args=(variable,))


def streaming_sum(values, name="sum"):
  """(value, update_op) of the running sum of values."""
  with tf.compat.v1.variable_scope(None, default_name=name):
    total = _metric_variable([], "total")
    update = tf.compat.v1.assign_add(total, tf.reduce_sum(tf.cast(values, tf.float32)))
    return _across_replicas(tf.identity, total), update


def streaming_confusion_matrix(labels, predictions, num_classes, weights, name="confusion",
                               value_fn=tf.identity):
  """(value_fn(matrix), update_op): matrix holds weighted counts [num_classes, num_classes].

  Rows are the true class. value_fn runs once over all replicas' counts.
  """
  with tf.compat.v1.variable_scope(None, default_name=name):
    total = _metric_variable([num_classes, num_classes], "matrix")
    batch = tf.math.confusion_matrix(labels, predictions, num_classes,
                                     weights=weights, dtype=tf.float32)
    update = tf.compat.v1.assign_add(total, batch)
    return _across_replicas(value_fn, total), update


def macro_f1_from_confusion(matrix):
  """Mean over classes of F1 = 2TP / (2TP + FP + FN); classes never seen nor predicted skipped."""
  true_positives = tf.linalg.diag_part(matrix)
  predicted = tf.reduce_sum(matrix, axis=0)
  actual = tf.reduce_sum(matrix, axis=1)
  denominator = predicted + actual
  present = denominator > 0
  f1 = tf.math.divide_no_nan(2.0 * true_positives, denominator)
  return tf.math.divide_no_nan(
      tf.reduce_sum(tf.where(present, f1, tf.zeros_like(f1))),
      tf.reduce_sum(tf.cast(present, tf.float32)))


def classification_metrics(labels, logits, weights, num_classes):
  """The eval_metric_ops dict: name -> (value, update_op).

  Args:
    labels: int32 [batch], 0-based.
    logits: float32 [batch, num_classes].
    weights: float32 [batch]; 0 for padding examples.
    num_classes: K.
  """
  predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
  labels = tf.cast(labels, tf.int32)
  macro_f1, matrix_update = streaming_confusion_matrix(
      labels, predictions, num_classes, weights, value_fn=macro_f1_from_confusion)
  xent = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, logits, reduction=tf.compat.v1.losses.Reduction.NONE)
  result = {
      "accuracy": tf.compat.v1.metrics.accuracy(labels, predictions, weights),
      "mean_per_class_accuracy": tf.compat.v1.metrics.mean_per_class_accuracy(
          labels, predictions, num_classes, weights),
      "macro_f1": (macro_f1, matrix_update),
      "eval_loss": tf.compat.v1.metrics.mean(xent, weights),
      "num_eval_examples": streaming_sum(weights, "num_eval_examples"),
  }
  if num_classes > 5:
    in_top_5 = tf.cast(tf.math.in_top_k(labels, logits, 5), tf.float32)
    result["top_5_accuracy"] = tf.compat.v1.metrics.mean(in_top_5, weights)
  return result
