"""tf.contrib.summary.create_file_writer: TF 1.15's writer, made outside any loop calling it."""

import tensorflow as tf
from tensorflow.python.ops import summary_ops_v2


def create_file_writer(logdir, max_queue=None, flush_millis=None, filename_suffix=None,
                       name=None):
  """summary_ops_v2.create_file_writer, its resource and initializer built in tf.init_scope().

  A host_call calls it; off TPU the host_call runs inside the training loop
  (engines/host_loop.py), where an initializer could not be run before the
  first step. Built outside, it is one more op of the graph's writer
  initializers, as TF 1.15 made it at the host_call's top level.
  """
  with tf.init_scope():
    return summary_ops_v2.create_file_writer(logdir, max_queue=max_queue,
                                             flush_millis=flush_millis,
                                             filename_suffix=filename_suffix, name=name)
