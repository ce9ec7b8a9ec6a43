"""tf.contrib.slim and tf.contrib.framework through the tf-slim package (compat.slim)."""

import ast
import importlib
import io
import os
import pkgutil
import sys
import types

import numpy as np
from PIL import Image
import programs
import pytest

from estimator_tpu.compat import check
from estimator_tpu.compat import registry
from estimator_tpu.compat import slim
from estimator_tpu.compat import tf

tf_slim = importlib.import_module("tf_slim")  # after the compat import, as a program does

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _slim_modules():
  names = []
  for info in pkgutil.walk_packages(tf_slim.__path__, "tf_slim."):
    if not info.name.endswith("_test") and info.name != "tf_slim.data.test_utils":
      names.append(info.name)
  return names


def test_every_tf_name_tf_slim_uses_resolves_on_the_installed_tensorflow():
  # The rule behind SUPPLIED: each `module.name` a tf_slim module reads from a TF module.
  unresolved, viewed = [], set()
  for name in _slim_modules():
    module = importlib.import_module(name)
    with open(module.__file__, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
        continue
      value = vars(module).get(node.value.id)
      if isinstance(value, types.ModuleType) and value.__name__.startswith("tensorflow"):
        if isinstance(value, slim.TensorFlowModule):
          viewed.add(value.__name__)
        try:
          getattr(value, node.attr)
        except (AttributeError, ImportError):
          unresolved.append(f"{name}: {value.__name__}.{node.attr}")
  assert unresolved == []
  assert viewed == set(slim.SUPPLIED)


@pytest.mark.parametrize("module,name", [(m, n) for m, names in slim.SUPPLIED.items()
                                         for n in names])
def test_each_supplied_name_is_one_tensorflow_lacks_and_its_home_has(module, name):
  real = importlib.import_module(module)
  with pytest.raises((AttributeError, ImportError)):
    getattr(real, name)
  assert getattr(slim.view(real), name) is not None
  assert not hasattr(real, "_supplied")  # TensorFlow's own module is left as it is


def test_tf_contrib_slim_and_framework_are_tf_slims_objects():
  assert tf.contrib.slim is tf_slim
  assert tf.contrib.slim.nets.inception.inception_v3 is importlib.import_module(
      "tf_slim.nets.inception").inception_v3
  for name in registry.SLIM_FRAMEWORK:
    assert getattr(tf.contrib.framework, name) is getattr(tf_slim, name), name
  assert tf.contrib.layers.conv2d is tf_slim.conv2d
  assert tf.contrib.slim.tfexample_decoder.Image.__module__ == "tf_slim.data.tfexample_decoder"


@pytest.mark.parametrize("statement,name,expected", [
    ("from tensorflow.contrib import slim", "slim", "tf_slim"),
    ("import tensorflow.contrib.slim as slim", "slim", "tf_slim"),
    ("from tensorflow.contrib.slim.nets import inception", "inception", "tf_slim.nets.inception"),
    ("from tensorflow.contrib.slim.python.slim.data import tfexample_decoder",
     "tfexample_decoder", "tf_slim.data.tfexample_decoder"),
    ("from tensorflow.contrib.slim.python.slim.data import parallel_reader",
     "parallel_reader", "tf_slim.data.parallel_reader"),
    ("from tensorflow.contrib.slim.python.slim import learning", "learning", "tf_slim.learning"),
    ("from tensorflow.contrib.layers.python.layers import layers", "layers",
     "tf_slim.layers.layers"),
    ("from tensorflow.contrib.framework.python.ops import variables", "variables",
     "tf_slim.ops.variables"),
])
def test_slims_module_paths_are_tf_slims_modules(statement, name, expected):
  scope = {}
  exec(statement, scope)
  assert scope[name] is importlib.import_module(expected)


def test_the_framework_package_gives_functions_as_tf_1_15s_star_imports_did():
  from tensorflow.contrib.framework.python.ops import add_arg_scope
  from tensorflow.contrib.framework.python.ops import arg_scope
  from tensorflow.contrib.framework.python.ops.arg_scope import arg_scope as same
  assert arg_scope is same is tf_slim.arg_scope and add_arg_scope is tf_slim.add_arg_scope
  # Importing the module of the same name never rebinds the package's function.
  from tensorflow.contrib.framework.python.ops import arg_scope as again
  assert again is tf_slim.arg_scope


def _jpeg(height, width):
  buffer = io.BytesIO()
  pixels = np.arange(height * width * 3, dtype=np.uint8).reshape(height, width, 3)
  Image.fromarray(pixels).save(buffer, format="JPEG")
  return buffer.getvalue()


def test_tfexample_decoder_decodes_an_image_through_case_and_cond():
  decoder_lib = tf.contrib.slim.tfexample_decoder
  example = tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_jpeg(6, 10)])),
      "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"jpeg"])),
      "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}))
  with tf.Graph().as_default():
    decoder = decoder_lib.TFExampleDecoder(
        {"image/encoded": tf.FixedLenFeature((), tf.string),
         "image/format": tf.FixedLenFeature((), tf.string),
         "label": tf.FixedLenFeature((), tf.int64)},
        {"image": decoder_lib.Image(), "label": decoder_lib.Tensor("label")})
    image, label = decoder.decode(example.SerializeToString(), ["image", "label"])
    with tf.Session() as sess:
      image, label = sess.run([image, label])
  assert image.shape == (6, 10, 3) and image.dtype == np.uint8
  assert label == 3


def _net(images, is_training):
  slim_ = tf.contrib.slim
  with slim_.arg_scope([slim_.conv2d], normalizer_fn=slim_.batch_norm,
                       normalizer_params={"is_training": is_training}):
    net = slim_.conv2d(images, 4, [3, 3], scope="conv1")
  net = tf.reduce_mean(net, [1, 2])
  return slim_.fully_connected(net, 2, activation_fn=None, scope="logits")


def test_slim_layers_keep_slims_variable_names_and_restore_an_ema(tmp_path):
  images = np.random.RandomState(0).rand(2, 8, 8, 3).astype(np.float32)
  with tf.Graph().as_default():
    logits = _net(tf.constant(images), is_training=True)
    names = sorted(v.op.name for v in tf.global_variables())
    ema = tf.train.ExponentialMovingAverage(0.5)
    with tf.control_dependencies([tf.group(*tf.get_collection(tf.GraphKeys.UPDATE_OPS))]):
      average = ema.apply(tf.trainable_variables())
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      initial = sess.run(tf.contrib.framework.get_variables_by_name("logits/weights")[0])
      for v in tf.trainable_variables():
        sess.run(v.assign(tf.ones_like(v) * 2.0))
      sess.run(average)
      tf.train.Saver().save(sess, str(tmp_path / "model.ckpt"))
      trained = sess.run(logits)
  assert names == ["conv1/BatchNorm/beta", "conv1/BatchNorm/moving_mean",
                   "conv1/BatchNorm/moving_variance", "conv1/weights",
                   "logits/biases", "logits/weights"]
  with tf.Graph().as_default():
    logits = _net(tf.constant(images), is_training=False)
    assert len(tf.contrib.framework.get_variables_to_restore()) == len(names)
    ema_names = tf.train.ExponentialMovingAverage(0.5).variables_to_restore(
        tf.contrib.framework.get_trainable_variables())
    init_fn = tf.contrib.framework.assign_from_checkpoint_fn(str(tmp_path / "model.ckpt"),
                                                             ema_names)
    with tf.Session() as sess:
      init_fn(sess)
      weights = sess.run(tf.contrib.framework.get_variables_by_name("logits/weights")[0])
  # The moving average, restored under the variable's own name: one step from the
  # initial value towards 2.0 with decay 0.5.
  np.testing.assert_allclose(weights, 0.5 * initial + 0.5 * 2.0, rtol=1e-6)
  assert trained.shape == (2, 2)


def test_compat_check_reports_slim_programs_mapped(tmp_path):
  program = tmp_path / "slim_program.py"
  program.write_text(
      "from estimator_tpu.compat import tf\n"
      "from tensorflow.contrib.framework.python.ops import arg_scope\n"
      "from tensorflow.contrib.slim.nets import inception\n"
      "from tensorflow.contrib.layers.python.layers import layers as layers_lib\n"
      "tf.contrib.slim.arg_scope, tf.contrib.slim.nets.inception.inception_v3\n"
      "tf.contrib.framework.assign_from_checkpoint_fn, tf.contrib.framework.variable\n"
      "tf.contrib.slim.parallel_reader.get_data_files, layers_lib.conv2d\n"
      "inception.inception_v3_arg_scope, arg_scope, tf.contrib.slim.no_such_layer\n")
  lines = []
  assert check.main([str(program)], out=lines.append) == 1
  statuses = {}
  for line in lines[:-1]:
    name, status = line.split(": ", 1)[1].split("  ")[:2]
    statuses[name] = status
  assert statuses.pop("tf.contrib.slim.no_such_layer") == "unknown"
  assert set(statuses.values()) == {"mapped"}, lines
  assert len(statuses) == 10


def test_tf_slim_imported_before_compat_gets_its_names_too():
  code = ("import tf_slim.layers.utils as utils\n"
          "import estimator_tpu.compat\n"
          "print(utils.ops.Tensor.__name__, utils.control_flow_ops.cond.__name__)\n")
  done = programs.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True, cwd=REPO,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.stdout.split() == ["Tensor", "cond"]


def test_without_tf_slim_the_message_says_how_to_install_it(monkeypatch):
  def missing(name, *args, **kwargs):
    if name == slim.PACKAGE:
      raise ModuleNotFoundError(f"No module named '{name}'", name=name)
    return real_import(name, *args, **kwargs)
  real_import = importlib.import_module
  monkeypatch.setattr(importlib, "import_module", missing)
  with pytest.raises(ImportError, match="tf-slim package, which is not installed"):
    slim.package()
