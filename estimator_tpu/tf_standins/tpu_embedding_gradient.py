"""Stand-in for `tensorflow.python.tpu.tpu_embedding_gradient`, which TF 2.16 removed.

TPUEstimator calls its functions only when TPU embeddings are configured; each
raises UnavailableOnThisStack naming the stack that has them.
"""

from estimator_tpu.tf_standins._refusal import UnavailableOnThisStack

FEATURE = "TPU embedding gradients (TPUEstimator's embedding_config_spec)"


def _refuse(name):
  raise UnavailableOnThisStack(f"{FEATURE}: tpu_embedding_gradient.{name}")


def create_dummy_table_variables(tpu_embedding):
  del tpu_embedding
  _refuse("create_dummy_table_variables")


def hook_dummy_table_variables_to_activations(tpu_embedding, activations, dummy_tables):
  del tpu_embedding, activations, dummy_tables
  _refuse("hook_dummy_table_variables_to_activations")


def get_gradients_through_dummy_table_variables(tpu_embedding):
  del tpu_embedding
  _refuse("get_gradients_through_dummy_table_variables")
