"""Stand-in for `tensorflow.python.tpu.tpu_embedding` (TF 1 TPU embeddings), which TF 2.16 removed.

The estimator imports seven optimizer-parameter classes from it when it loads,
so those names exist; building any of them, or reaching any other name of the
module, means the program configures TPU embeddings
(`EmbeddingConfigSpec`), and raises UnavailableOnThisStack naming the stack
that has them. Programs without TPU embeddings never touch this module.
"""

from estimator_tpu.tf_standins._refusal import UnavailableOnThisStack

FEATURE = "TPU embeddings (TPUEstimator's embedding_config_spec)"


class _Parameters:
  """An optimizer for TPU embedding tables: refused when built."""

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise UnavailableOnThisStack(f"{FEATURE}: {type(self).__name__}")


class AdagradParameters(_Parameters):
  pass


class AdamParameters(_Parameters):
  pass


class FtrlParameters(_Parameters):
  pass


class MomentumParameters(_Parameters):
  pass


class ProximalAdagradParameters(_Parameters):
  pass


class RMSPropParameters(_Parameters):
  pass


class StochasticGradientDescentParameters(_Parameters):
  pass


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  raise UnavailableOnThisStack(f"{FEATURE}: tpu_embedding.{name}")
