"""tf.contrib.data transformations TF 2 removed, for use with `Dataset.apply`.

Each function returns `lambda dataset: ...`, as the originals did. The ones TF
2.15 still has (map_and_batch, parallel_interleave, shuffle_and_repeat, ...)
are mapped to tf.data.experimental in the registry instead.
"""

import tensorflow as tf


def batch_and_drop_remainder(batch_size):
  """Batches, dropping a last partial batch (static batch dimension).

  Args:
    batch_size: elements per batch (int or scalar int64 tensor).

  Returns:
    A `Dataset.apply` transformation.
  """
  return lambda dataset: dataset.batch(batch_size, drop_remainder=True)


def padded_batch_and_drop_remainder(batch_size, padded_shapes,
                                    padding_values=None):
  """Padded-batches, dropping a last partial batch.

  Args:
    batch_size: elements per batch.
    padded_shapes: as for `Dataset.padded_batch`.
    padding_values: as for `Dataset.padded_batch`.

  Returns:
    A `Dataset.apply` transformation.
  """
  return lambda dataset: dataset.padded_batch(
      batch_size, padded_shapes, padding_values, drop_remainder=True)


def assert_element_shape(expected_shapes):
  """Asserts (at run time) and sets (statically) each element's shapes.

  Args:
    expected_shapes: a structure of shapes matching the dataset's elements;
      unknown dimensions (None) are not checked.

  Returns:
    A `Dataset.apply` transformation.
  """
  def _check(*element):
    element = element[0] if len(element) == 1 else element
    return tf.nest.map_structure(
        lambda x, shape: tf.ensure_shape(x, tf.TensorShape(shape)),
        element, expected_shapes)
  return lambda dataset: dataset.map(_check)
