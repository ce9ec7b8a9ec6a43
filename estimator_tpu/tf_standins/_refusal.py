"""The one message a stand-in gives for a TPU-only feature that current TensorFlow lacks."""

STACK_HINT = ("it needs TensorFlow <= 2.15: use the tf2.15 stack "
              "(make test STACK=tf2.15, requirements/tf2.15.lock), which Cloud TPU VM "
              "images with the tpu-vm-tf-2.15.1-se runtime carry")


class UnavailableOnThisStack(NotImplementedError):
  """A TPU-only feature whose TensorFlow half was removed in TF 2.16."""

  def __init__(self, feature):
    import tensorflow as tf
    super().__init__(f"{feature} is not available on TensorFlow {tf.__version__}: "
                     f"{STACK_HINT}.")
