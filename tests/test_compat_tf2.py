"""`from estimator_tpu.compat import tf2 as tf`: TF 2's API with the estimator's TF 2 API on it."""

import os
import sys

from conftest import program_env
import programs
import pytest

from estimator_tpu import stacks
from estimator_tpu.compat import tf2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tf_estimator_is_the_tf_2_api_and_the_rest_is_tensorflow():
  import tensorflow
  assert tf2.estimator.DNNClassifier.__name__ == "DNNClassifierV2"
  assert tf2.estimator.Estimator.__name__ == "EstimatorV2"
  assert tf2.estimator.export.build_parsing_serving_input_receiver_fn is (
      stacks.estimator.export.build_parsing_serving_input_receiver_fn)
  assert tf2.saved_model.load is tensorflow.saved_model.load
  assert tf2.types is tensorflow.types and tf2.__version__ == tensorflow.__version__
  assert tf2.compat.v1.estimator.DNNClassifier.__name__ == "DNNClassifier"  # the TF 1 API
  assert tf2.compat.v1.estimator.inputs.numpy_input_fn is not None
  assert tf2.compat.v2.estimator.DNNClassifier is tf2.estimator.DNNClassifier
  assert tf2.keras.estimator.model_to_estimator is not None
  assert "estimator" in dir(tf2) and "DNNClassifier" in dir(tf2.estimator)


def test_boosted_trees_are_refused_naming_decision_forests():
  with pytest.raises(AttributeError, match="BoostedTreesClassifier is gone from the estimator.*"
                                           "TensorFlow Decision Forests"):
    tf2.estimator.BoostedTreesClassifier  # noqa: B018


PROGRAM = """
from estimator_tpu.compat import tf2
import tensorflow as tf
print(type(tf.zeros([2, 3]).shape[1]).__name__, type(tf2.zeros([2, 3]).shape[1]).__name__)
print(tf.executing_eagerly())
from estimator_tpu.compat import tf as tf1
with tf1.Graph().as_default():
  x = tf1.placeholder(tf1.float32, [None, 3])
  print(x.shape[1].value)
"""


def test_tf2_keeps_tf_2_behaviour_and_tf_1_code_beside_it_still_runs():
  done = programs.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True,
                        text=True, timeout=120, env=program_env(TF_CPP_MIN_LOG_LEVEL="3"))
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split() == ["int", "int", "True", "3"]
