"""tf.compat.v1 names served as TF 1.15 had them (registry.V1_OVERLAYS); the rest are TF's."""

import tensorflow as tf

from estimator_tpu.compat import _lazy
from estimator_tpu.compat import cluster_resolver
from estimator_tpu.compat import registry
from estimator_tpu.compat import tf as compat_tf


def _leaves(entries, path=()):
  for name, entry in entries.items():
    if isinstance(entry, dict):
      yield from _leaves(entry, (*path, name))
    else:
      yield (*path, name), entry


def test_every_overlaid_name_exists_in_the_installed_tensorflow():
  for path, entry in _leaves(registry.V1_OVERLAYS):
    value = tf.compat.v1
    for part in path:
      value = getattr(value, part)  # TensorFlow still has the name the overlay replaces
    assert entry.kind == _lazy.REIMPLEMENTED and _lazy.load(entry.target) is not None


def test_tpu_cluster_resolver_of_no_tpu_is_local_off_tpu_as_in_tf_1_15(monkeypatch):
  monkeypatch.delenv("TPU_NAME", raising=False)
  resolver = compat_tf.distribute.cluster_resolver.TPUClusterResolver("")
  assert isinstance(resolver, cluster_resolver.LocalClusterResolver)
  assert resolver.master() == "" and resolver.cluster_spec().as_dict() == {}


def test_the_rest_of_tf_distribute_is_tensorflows_own():
  assert compat_tf.distribute.MirroredStrategy is tf.compat.v1.distribute.MirroredStrategy
  assert (compat_tf.distribute.cluster_resolver.SimpleClusterResolver
          is tf.compat.v1.distribute.cluster_resolver.SimpleClusterResolver)
  assert "MirroredStrategy" in dir(compat_tf.distribute)
  # TensorFlow's own module is left as it was.
  assert tf.compat.v1.distribute.cluster_resolver.TPUClusterResolver.__module__.startswith(
      "tensorflow.")
