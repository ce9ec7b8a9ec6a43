"""tf.contrib.lookup table builders, with their TF 1 `mapping` argument.

They build the same tables as TF 1's (lookup_ops, which tf.contrib.lookup
wrapped), so out-of-vocabulary hash buckets land on the same ids as before:
embedding checkpoints trained with TF 1 stay valid.
"""

import tensorflow as tf
from tensorflow.python.ops import lookup_ops


def _vocabulary(mapping, vocabulary_list):
  if (mapping is None) == (vocabulary_list is None):
    raise ValueError("Pass exactly one of `mapping` (TF 1 name) or "
                     "`vocabulary_list` (TF 2 name), got "
                     f"mapping={mapping!r}, vocabulary_list={vocabulary_list!r}.")
  return mapping if vocabulary_list is None else vocabulary_list


def index_table_from_tensor(mapping=None, num_oov_buckets=0, default_value=-1,
                            hasher_spec=lookup_ops.FastHashSpec,
                            dtype=tf.string, name=None, vocabulary_list=None):
  """A table mapping keys to int64 ids: their position in `mapping`.

  Unknown keys map to `default_value`, or with `num_oov_buckets > 0` to
  `len(mapping) + hash(key) % num_oov_buckets`. In graph mode run
  `tf.tables_initializer()` before the first lookup.

  Args:
    mapping: 1-D string or integer tensor (or list) of distinct keys.
    num_oov_buckets: number of out-of-vocabulary buckets.
    default_value: id of unknown keys when there are no buckets.
    hasher_spec: the bucket hash; FastHashSpec as in TF 1.
    dtype: key dtype (tf.string or an integer type).
    name: op name scope.
    vocabulary_list: TF 2's name for `mapping`.

  Returns:
    A lookup table; `table.lookup(keys)` gives int64 ids of keys' shape.
  """
  return lookup_ops.index_table_from_tensor(
      _vocabulary(mapping, vocabulary_list), num_oov_buckets=num_oov_buckets,
      default_value=default_value, hasher_spec=hasher_spec, dtype=dtype,
      name=name)


def index_to_string_table_from_tensor(mapping=None, default_value="UNK",
                                      name=None, vocabulary_list=None):
  """A table mapping int64 ids to the strings at those positions of `mapping`.

  Args:
    mapping: 1-D string tensor (or list).
    default_value: string for ids out of range.
    name: op name scope.
    vocabulary_list: TF 2's name for `mapping`.

  Returns:
    A lookup table; `table.lookup(ids)` gives strings of ids' shape.
  """
  return lookup_ops.index_to_string_table_from_tensor(
      _vocabulary(mapping, vocabulary_list), default_value=default_value,
      name=name)
