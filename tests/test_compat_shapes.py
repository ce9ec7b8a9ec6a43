"""TF 1 shapes and a quiet process under estimator_tpu.compat; the library the same either way.

The first use of `estimator_tpu.compat.tf` turns on TF 1 TensorShape semantics
for the whole process (TensorFlow's own switch). The library's input pipeline,
model, preflight and export must not notice: the second half of this file runs
each with TF 2 shapes and with TF 1 shapes and compares the results.
"""

import os
import re
import subprocess
import sys

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
from conftest import program_env
from conftest import tiny_config
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_shape

from estimator_tpu import stacks
from estimator_tpu.compat import activation
from estimator_tpu.data import digits
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as tpu_estimator
from estimator_tpu.export import contract
from estimator_tpu.export import saved_model
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.run import assemble
from estimator_tpu.tpu import findings as findings_lib
from estimator_tpu.tpu import preflight

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LEGACY_PROGRAM = """
import logging
logging.getLogger("tensorflow").setLevel(logging.INFO)  # tf.logging.set_verbosity(INFO)
from estimator_tpu.compat import tf
with tf.Graph().as_default():
  x = tf.placeholder(tf.float32, [None, 5, 3])
  print(type(x.shape[-1]).__name__, x.shape[-1].value, x.shape[0].value,
        x.get_shape()[1].value, isinstance(x.shape[1], tf.Dimension))
  print(x.shape.as_list(), [d.value for d in x.shape], x.shape[1:].as_list())
  print(x.shape.merge_with([7, None, 3]).as_list())
  print(tf.Dimension(3) + 2, tf.Dimension(None) + 2, tf.Dimension(4) * tf.Dimension(2),
        tf.Dimension(7) // 2, tf.Dimension(None) == 3, tf.Dimension(3) == 3,
        tf.Dimension(3) < 4, tf.Dimension(None) < 4)
  dense = tf.layers.dense(tf.zeros([2, 3]), 4)
  tf.contrib.data.map_and_batch(lambda v: v, 2)
  tf.contrib.tpu.CrossShardOptimizer(tf.train.GradientDescentOptimizer(0.1))
  tf.contrib.tpu.RunConfig(tpu_config=tf.contrib.tpu.TPUConfig(2))
  tf.estimator.tpu.InputPipelineConfig.PER_HOST_V2
  tf.contrib.training.HParams(a=1)
  print(dense.shape[-1].value)
"""


def _run_legacy(**env):
  done = subprocess.run([sys.executable, "-c", LEGACY_PROGRAM], cwd=REPO, capture_output=True,
                        text=True, timeout=120,
                        env=program_env(TF_CPP_MIN_LOG_LEVEL="3", **env))
  return done


def test_legacy_code_gets_tf_1_shapes_and_one_quiet_line():
  done = _run_legacy()
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines() == [
      "Dimension 3 None 5 True",
      "[None, 5, 3] [None, 5, 3] [5, 3]",
      "[7, 5, 3]",
      "5 ? 8 3 None True True None",
      "4",
  ]
  log = done.stderr
  assert len([line for line in log.splitlines() if "estimator_tpu.compat active" in line]) == 1
  assert "TF 1 shapes on" in log
  assert "deprecated" not in log
  assert "estimator_tpu/" not in log  # nothing points at this package's files


def test_shapes_can_stay_tf_2_and_a_bad_mode_is_named():
  done = _run_legacy(**{activation.SHAPES_ENV: "v2"})
  assert done.returncode != 0
  assert "AttributeError: 'int' object has no attribute 'value'" in done.stderr
  done = _run_legacy(**{activation.SHAPES_ENV: "1"})
  assert done.returncode != 0
  assert "ESTIMATOR_TPU_COMPAT_SHAPES='1' is not a shape mode: use v1" in done.stderr


# --- the library, with TF 2 shapes and with TF 1 shapes ------------------------------------


def _input_pipeline(digits_dir):
  dataset = input_pipeline.make_input_fn(
      f"{digits_dir}/validation-*", False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=8)({"batch_size": 8})
  features, labels = next(iter(dataset))
  spec = tf.nest.map_structure(lambda s: (s.shape.as_list(), s.dtype.name), dataset.element_spec)
  return {"spec": spec, "images": features["image"].numpy(), "labels": labels.numpy()}


def _train_graph(config):
  """Every op of the TRAIN graph: name, type and output shapes."""
  params = dict(tpu_estimator.build_params(config, config.data.class_names), batch_size=8,
                use_tpu=False)
  with tf.Graph().as_default() as graph:
    tf.compat.v1.random.set_random_seed(1)
    features = {"image": tf.zeros([8, IMAGE_SIZE, IMAGE_SIZE, 3]), "weight": tf.ones([8])}
    model_fn_lib.model_fn(features, tf.zeros([8], tf.int32), stacks.ModeKeys.TRAIN,
                          params)
  return [(op.name, op.type, [o.shape.as_list() if o.shape.rank is not None else None
                              for o in op.outputs]) for op in graph.get_operations()]


def _preflight(config, digits_dir):
  train_fn = input_pipeline.make_input_fn(f"{digits_dir}/train-*", True, IMAGE_SIZE, seed=1)
  findings = preflight.run_checks(config, model_fn_lib.model_fn, train_fn)
  # The loss of a random initial step and the seconds it took vary from run to run.
  return [(f.status, re.sub(r"\d+\.\d+", "#", f.message)) for f in findings]


def _export_and_serve(trained_model_dir, export_dir):
  config, checkpoint = assemble.prepare_export(trained_model_dir, export_dir,
                                               report=lambda *_: None)
  estimator = assemble.build(config)
  path = saved_model.export_saved_model(estimator, export_dir, config.data.image_size,
                                        checkpoint_path=checkpoint)
  images, _ = digits.digit_arrays(limit=4, size=IMAGE_SIZE)
  jpegs = [digits.encode_jpeg(image) for image in images]
  serve = tf.saved_model.load(path).signatures[contract.SERVING_SIGNATURE]
  outputs = serve(image_bytes=tf.constant(jpegs))
  signature = sorted((key, spec.shape.as_list()) for key, spec in
                     serve.structured_outputs.items())
  return {"signature": signature,
          **{key: value.numpy() for key, value in outputs.items()}}


def _library_results(digits_dir, trained_model_dir, root):
  config = tiny_config(os.path.join(root, "model"), train_batch_size=64, eval_batch_size=64)
  return {"input": _input_pipeline(digits_dir),
          "train_graph": _train_graph(config),
          "preflight": _preflight(config, digits_dir),
          "export": _export_and_serve(trained_model_dir, os.path.join(root, "export"))}


@pytest.fixture
def shape_mode():
  """Sets TF 2 (True) or TF 1 (False) shapes; puts back what the process had."""
  before = tensor_shape._TENSORSHAPE_V2_OVERRIDE

  def set_mode(v2):
    tensor_shape._TENSORSHAPE_V2_OVERRIDE = v2
    assert isinstance(tf.TensorShape([3])[0], int) == v2
  yield set_mode
  tensor_shape._TENSORSHAPE_V2_OVERRIDE = before


def test_library_behaves_the_same_with_tf_1_shapes(digits_dir, trained_model_dir, tmp_path,
                                                   shape_mode):
  shape_mode(True)
  v2 = _library_results(digits_dir, trained_model_dir, str(tmp_path / "v2"))
  shape_mode(False)
  v1 = _library_results(digits_dir, trained_model_dir, str(tmp_path / "v1"))
  assert v1["input"]["spec"] == v2["input"]["spec"]
  np.testing.assert_array_equal(v1["input"]["images"], v2["input"]["images"])
  np.testing.assert_array_equal(v1["input"]["labels"], v2["input"]["labels"])
  assert v1["train_graph"] == v2["train_graph"] and len(v2["train_graph"]) > 100
  assert v1["preflight"] == v2["preflight"]
  assert [status for status, _ in v2["preflight"]].count(findings_lib.PASS) >= 3
  assert v1["export"]["signature"] == v2["export"]["signature"]
  for key in (contract.PROBABILITIES, contract.CLASSID, contract.CLASS):
    np.testing.assert_array_equal(v1["export"][key], v2["export"][key])
  assert v2["export"][contract.PROBABILITIES].shape == (4, 10)
