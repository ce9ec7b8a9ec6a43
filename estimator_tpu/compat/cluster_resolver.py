"""tf.contrib.cluster_resolver.TPUClusterResolver that a CPU run can ignore.

TF 2.15's TPUClusterResolver(None) or (tpu='') off Cloud TPU raises
"Please provide a TPU Name to connect to." (tensorflow/tpu#160). Legacy
scripts build the resolver unconditionally and pass it to RunConfig, so here
an empty name with no TPU in the environment gives a local resolver (master
'', empty cluster spec) that RunConfig and a use_tpu=False run ignore.
"""

import tensorflow as tf

from estimator_tpu.compat import _util


class LocalClusterResolver(tf.distribute.cluster_resolver.SimpleClusterResolver):
  """What TPUClusterResolver(None) returns when there is no TPU to find.

  `master()` and the TF 1 `get_master()` are '' (the in-process master) and
  the cluster spec is empty, so `tf.contrib.tpu.RunConfig(cluster=...)` adds
  nothing to the session config.
  """

  def __init__(self):
    super().__init__(tf.train.ClusterSpec({}), master="")

  def get_master(self):
    return self.master()

  def __repr__(self):
    return "LocalClusterResolver(master='')"


def TPUClusterResolver(tpu=None, *args, **kwargs):
  """Resolves a Cloud TPU, or returns a LocalClusterResolver when none is named.

  Args:
    tpu: the TPU name, grpc:// address or 'local', as for
      `tf.distribute.cluster_resolver.TPUClusterResolver`; None or '' with no
      TPU_NAME in the environment means "no TPU".
    *args: passed on to the TF 2.15 TPUClusterResolver.
    **kwargs: passed on (zone, project, job_name, ...).

  Returns:
    A `tf.distribute.cluster_resolver.TPUClusterResolver`, or a
    `LocalClusterResolver` (with one INFO line) when `tpu` is empty and
    nothing in the environment names a TPU.

  Raises:
    ValueError: a named TPU could not be resolved (TF 2.15's error).
  """
  try:
    return tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu, *args, **kwargs)
  except ValueError:
    if tpu:
      raise
  _util.note_once(
      "TPUClusterResolver", "TPUClusterResolver(tpu=%r): no TPU name given "
      "or found in the environment; using a local resolver (master='') that "
      "a use_tpu=False run ignores.", tpu)
  return LocalClusterResolver()
