"""--deterministic: TensorFlow's op determinism, on while a run trains and put back after."""

import contextlib

import tensorflow as tf
from tensorflow.python.framework import config as tf_config


@contextlib.contextmanager
def deterministic_ops(enabled):
  """Runs the block with tf.config.experimental.enable_op_determinism() when enabled.

  Op determinism makes every kernel built in the block give the same result
  for the same inputs (kernels without a deterministic form raise
  UnimplementedError naming themselves), and makes tf.data keep its order:
  a map or interleave runs in order, and one whose function holds stateful
  ops on one thread. It is a process-wide switch, so it is put back as it
  was when the block ends: a library caller's later work is not slowed.

  What else --deterministic needs is done where it belongs: the seeds in
  assemble.build (Python, NumPy, TensorFlow's graph seed for Keras) and the
  estimators' RunConfig(tf_random_seed), the input order and keyed draws in
  data/input_pipeline.py (make_input_fn(deterministic=True)).

  Args:
    enabled: config.train.deterministic; False leaves everything as it is.
  """
  if not enabled:
    yield
    return
  # enable_op_determinism is public; asking whether it is on and turning it off are not.
  before = tf_config.is_op_determinism_enabled()
  tf.config.experimental.enable_op_determinism()
  try:
    yield
  finally:
    if not before:
      tf_config.disable_op_determinism()
