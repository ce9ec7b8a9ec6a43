"""TF Serving deployment of an exported model: server config, a client, and a local batch predictor.

The tensor and signature names are export_lib's constants; this package adds
only what a deployment names: the model's name on the server and its ports.
TF Serving's config files (models.config, batching_parameters.txt) are this
package's data, installed with it. The repository's top-level serving/ runs
these modules as `python -m serving.predict` and `python -m serving.client`.
"""

import os
import re

from estimator_tpu import tf_startup

# Before estimator_tpu.serving.predict and .client import TensorFlow: its C++ start-up
# lines stay off stderr.
tf_startup.install()

__all__ = ["MODEL_NAME", "REST_PORT", "GRPC_PORT", "SERVING_IMAGE", "CONFIG_DIR", "MODELS_CONFIG",
           "BATCHING_PARAMETERS", "error_reason"]

MODEL_NAME = "image_classifier"
REST_PORT = 8501
GRPC_PORT = 8500
SERVING_IMAGE = "tensorflow/serving:2.15.1"
CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
MODELS_CONFIG = os.path.join(CONFIG_DIR, "models.config")
BATCHING_PARAMETERS = os.path.join(CONFIG_DIR, "batching_parameters.txt")
_TF_DECORATIONS = ("Graph execution error", "Detected at node", "<stack traces", "[[")


def error_reason(error):
  """A TensorFlow error -> its one-line reason, without TF's node and op decorations.

  E.g. 'Unknown image file format. One of JPEG, PNG, GIF, BMP required.'
  """
  message = re.sub(r"^\{\{[^}]*\}\}\s*", "", getattr(error, "message", str(error)))
  lines = [line.strip() for line in message.split(" [Op:")[0].splitlines()]
  lines = [line for line in lines if line and not line.startswith(_TF_DECORATIONS)]
  return lines[0] if lines else type(error).__name__
