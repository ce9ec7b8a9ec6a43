"""End-to-end test of examples/legacy_tpu_model: 2018-style TPU code on TF 2.15, CPU."""

import ast
import glob
import os

from conftest import summary_tags
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu import testing
from examples.legacy_tpu_model import main
from examples.legacy_tpu_model import model

EXAMPLE_DIR = os.path.dirname(model.__file__)
TRAIN_STEPS = 300
NUM_EVAL = 200
EVAL_BATCH = 50
# Measured 0.945-0.975 over 32 runs (sloppy interleave and shuffling vary).
MIN_ACCURACY = 0.8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Writes digits, runs the example's own train_and_evaluate and export."""
  root = tmp_path_factory.mktemp("legacy")
  data_dir = testing.write_digits_dataset(
      str(root / "data"), num_train=800, num_eval=NUM_EVAL)
  model_dir, export_dir = str(root / "model"), str(root / "export")
  results, export_path = main.train_and_evaluate(
      data_dir, model_dir, train_steps=TRAIN_STEPS, steps_per_eval=150,
      train_batch_size=32, eval_batch_size=EVAL_BATCH,
      num_eval_images=NUM_EVAL, export_dir=export_dir)
  return {"data_dir": data_dir, "model_dir": model_dir, "results": results,
          "export_path": export_path.decode()}


def test_trains_well_above_chance(run):
  assert run["results"]["global_step"] == TRAIN_STEPS
  assert run["results"]["accuracy"] >= MIN_ACCURACY


def _validation_jpegs(data_dir, count):
  path = glob.glob(os.path.join(data_dir, "validation-*"))[0]
  jpegs, labels = [], []
  for record in tf.data.TFRecordDataset(path).take(count):
    example = tf.train.Example.FromString(record.numpy())
    feature = example.features.feature
    jpegs.append(feature["image/encoded"].bytes_list.value[0])
    labels.append(feature["image/class/label"].int64_list.value[0] - 1)
  return jpegs, np.array(labels)


def test_export_savedmodel_loads_and_predicts_jpegs(run):
  jpegs, labels = _validation_jpegs(run["data_dir"], 8)
  serve = tf.saved_model.load(run["export_path"]).signatures["serving_default"]
  outputs = serve(image_bytes=tf.constant(jpegs))
  probabilities = outputs["probabilities"].numpy()
  assert probabilities.shape == (8, 10)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
  classes = outputs["classes"].numpy()
  assert classes.shape == (8,)
  np.testing.assert_array_equal(classes, probabilities.argmax(axis=1))
  assert (classes == labels).mean() >= 0.5


def test_host_call_wrote_contrib_summaries(run):
  assert {"host_loss", "learning_rate"} <= summary_tags(run["model_dir"])


def test_input_fn_batches_have_static_shapes(run):
  input_fn = model.make_input_fn(os.path.join(run["data_dir"], "train-*"),
                                 stacks.ModeKeys.TRAIN)
  dataset = input_fn({"batch_size": 4})
  images, labels = next(iter(dataset))
  assert images.shape == (4, 32, 32, 3) and images.dtype == tf.float32
  assert dataset.element_spec[1].shape == (4,)
  # Scaled to [0, 1], with real strokes in it (not an all-black batch).
  assert float(tf.reduce_min(images)) >= 0.0 and float(tf.reduce_max(images)) <= 1.0
  assert float(tf.reduce_max(images)) > 0.5
  assert set(labels.numpy().tolist()) <= set(range(10))


@pytest.mark.parametrize("mode", [stacks.ModeKeys.TRAIN,
                                  stacks.ModeKeys.EVAL])
def test_model_fn_accepts_project_style_dict_features(mode):
  params = {"num_label_classes": 10, "use_tpu": False, "batch_size": 4}
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    features = {"image": tf.zeros([4, 32, 32, 3]),
                "weight": tf.constant([1.0, 1.0, 1.0, 0.0])}
    spec = model.model_fn(features, tf.constant([0, 1, 2, 3]), mode, params)
  assert spec.loss.shape == ()
  if mode == stacks.ModeKeys.TRAIN:
    assert spec.train_op is not None and spec.host_call is None
  else:
    metric_fn, tensors = spec.eval_metrics
    assert metric_fn is model.metric_fn and len(tensors) == 3


def test_example_imports_only_the_compat_tf_from_the_project():
  for path in glob.glob(os.path.join(EXAMPLE_DIR, "*.py")):
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        assert not any(a.name.startswith("estimator_tpu") for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.module:
        if node.module.startswith("estimator_tpu"):
          assert (node.module, [a.name for a in node.names]) == (
              "estimator_tpu.compat", ["tf"]), path
        else:
          assert node.module.startswith("examples.legacy_tpu_model"), path
