"""eval_metrics.py: which metric_fns run on the host and which in the evaluation step (off TPU)."""

import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import eval_metrics
from estimator_tpu.model import model_fn as model_fn_lib


def _graph_tensors():
  labels = tf.compat.v1.placeholder(tf.int32, [4])
  logits = tf.compat.v1.placeholder(tf.float32, [4, 3])
  return labels, logits


def _accuracy(labels, logits):
  return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))}


@pytest.mark.parametrize("make", [
    lambda labels, logits: (_accuracy, [labels, logits]),
    lambda labels, logits: (_accuracy, {"labels": labels, "logits": logits}),
    # The package's own metrics: local variables, merge_call reads, weights.
    lambda labels, logits: (model_fn_lib.make_metric_fn(3), [labels, logits, tf.ones([4])])])
def test_a_metric_fn_of_its_arguments_alone_runs_on_the_host(make):
  with tf.Graph().as_default():
    metric_fn, tensors = make(*_graph_tensors())
    assert not eval_metrics.reads_beyond_its_arguments(metric_fn, tensors)
    assert not tf.compat.v1.local_variables()  # the probe made nothing in the program's graph


def test_a_metric_fn_reading_the_model_fns_tensors_runs_in_the_step():
  with tf.Graph().as_default():
    labels, logits = _graph_tensors()
    made = _accuracy(labels, logits)
    assert eval_metrics.reads_beyond_its_arguments(lambda: made, [])  # compat's dict form
    closure = lambda labels: _accuracy(labels, logits)  # noqa: E731
    assert eval_metrics.reads_beyond_its_arguments(closure, [labels])
    spec = stacks.tpu.TPUEstimatorSpec(stacks.ModeKeys.EVAL, loss=tf.constant(1.0),
                                       eval_metrics=(closure, [labels]))
    in_step = eval_metrics.in_the_step_off_tpu(spec, stacks.ModeKeys.EVAL, use_tpu=False)
    assert in_step.eval_metrics is None and sorted(in_step.eval_metric_ops) == ["accuracy"]
    assert in_step.loss is spec.loss
    assert eval_metrics.in_the_step_off_tpu(spec, stacks.ModeKeys.EVAL, use_tpu=True) is spec
