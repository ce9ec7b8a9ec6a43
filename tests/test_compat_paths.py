"""`import tensorflow.contrib...` and `tensorflow.python.estimator...` once compat is imported."""

import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types

import pytest

from estimator_tpu import libtpu_guard
from estimator_tpu import stacks
from estimator_tpu.compat import _lazy
from estimator_tpu.compat import registry
from estimator_tpu.compat import tf

MODULE_NAMES = [(relative, name) for relative in registry.MODULE_PATHS
                for name, entry in registry.module_path_entries(relative).items()
                if entry.kind != _lazy.REFUSED]
NAMESPACES = [name for name, entries in registry.CONTRIB.items() if isinstance(entries, dict)]


@pytest.mark.parametrize("relative,name", MODULE_NAMES)
def test_module_path_names_are_the_attribute_forms_objects(relative, name):
  module = importlib.import_module(f"tensorflow.contrib.{relative}")
  namespace, _ = registry.MODULE_PATHS[relative]
  assert getattr(module, name) is getattr(getattr(tf.contrib, namespace), name)


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_contrib_modules_are_the_tf_contrib_namespaces(namespace):
  module = importlib.import_module(f"tensorflow.contrib.{namespace}")
  assert module is getattr(tf.contrib, namespace)
  assert importlib.import_module("tensorflow.contrib") is tf.contrib
  assert sys.modules[f"tensorflow.contrib.{namespace}"] is module


def test_the_reference_models_import_lines():
  from tensorflow.contrib import cluster_resolver
  from tensorflow.contrib import summary
  from tensorflow.contrib.tpu.python.tpu import async_checkpoint
  import tensorflow.contrib.tpu.python.tpu.tpu_estimator as tpu_estimator
  from tensorflow.contrib.training.python.training import evaluation

  from estimator_tpu.compat import checkpoint_hooks
  assert summary is tf.contrib.summary and cluster_resolver is tf.contrib.cluster_resolver
  assert async_checkpoint.AsyncCheckpointSaverHook is checkpoint_hooks.AsyncCheckpointSaverHook
  assert tpu_estimator.TPUEstimator is stacks.estimator.tpu.TPUEstimator
  real_tf = importlib.import_module("tensorflow")
  assert evaluation.checkpoints_iterator is real_tf.compat.v1.train.checkpoints_iterator
  assert evaluation.evaluate_repeatedly is tf.contrib.training.evaluate_repeatedly


def test_moved_estimator_package_resolves_to_the_estimators_objects():
  from tensorflow.python.estimator import estimator
  from tensorflow.python.estimator.export import export
  assert estimator.Estimator is stacks.estimator.Estimator
  assert export.ServingInputReceiver is stacks.estimator.export.ServingInputReceiver
  # One module object per file: the alias never loads tensorflow_estimator's file a second time.
  home = importlib.import_module("tensorflow_estimator.python.estimator.estimator")
  assert estimator.Estimator is home.Estimator
  assert home.__spec__.name == "tensorflow_estimator.python.estimator.estimator"


@pytest.mark.parametrize("statement,path", [
    ("import tensorflow.contrib.foo", "tensorflow.contrib.foo"),
    ("from tensorflow.contrib import foo", "tensorflow.contrib.foo"),
    ("from tensorflow.contrib.tpu import NoSuchThing", "tensorflow.contrib.tpu.NoSuchThing"),
    ("from tensorflow.contrib.tpu.python.tpu.async_checkpoint import Nope",
     "tensorflow.contrib.tpu.python.tpu.async_checkpoint.Nope"),
    ("import tensorflow.contrib.tpu.python.tpu.nope", "tensorflow.contrib.tpu.python.tpu.nope"),
])
def test_an_unknown_path_fails_with_the_attribute_forms_message(statement, path):
  with pytest.raises(ImportError) as err:
    exec(statement, {})
  homes = registry.rule_homes(path[len("tensorflow.contrib."):])
  tried = f" (TF 2 has no {' or '.join(homes)})" if homes else ""
  assert str(err.value) == _lazy.unknown_message(path) + tried


# One path per MODULE_RULES row (TF 1.15 module, a name it held): the same object in TF 2.
RULE_EXAMPLES = {
    "tpu.python.tpu": ("tpu_function", "get_tpu_context", "tensorflow.python.tpu.tpu_function"),
    "cluster_resolver.python.training": (
        "cluster_resolver", "SimpleClusterResolver",
        "tensorflow.python.distribute.cluster_resolver.cluster_resolver"),
    "data.python.ops": ("readers", "make_csv_dataset",
                        "tensorflow.python.data.experimental.ops.readers"),
    "distribute.python": ("mirrored_strategy", "MirroredStrategy",
                          "tensorflow.python.distribute.mirrored_strategy"),
    "estimator.python.estimator": ("early_stopping", "stop_if_no_increase_hook",
                                   "tensorflow_estimator.python.estimator.early_stopping"),
    "slim.python.slim.data": ("tfexample_decoder", "TFExampleDecoder",
                              "tf_slim.data.tfexample_decoder"),
    "slim.python.slim.nets": ("resnet_v1", "resnet_v1_50", "tf_slim.nets.resnet_v1"),
    "slim.python.slim": ("learning", "train", "tf_slim.learning"),
    "slim": ("nets", "inception", "tf_slim.nets"),
    "framework.python.ops": ("variables", "assign_from_checkpoint_fn", "tf_slim.ops.variables"),
    "layers.python.layers": ("layers", "conv2d", "tf_slim.layers.layers"),
}


def test_every_module_rule_has_an_example():
  assert set(RULE_EXAMPLES) == set(registry.MODULE_RULES)


@pytest.mark.parametrize("prefix", sorted(registry.MODULE_RULES))
def test_each_module_rule_gives_tf_2s_module_on_the_installed_tensorflow(prefix):
  module_name, name, home = RULE_EXAMPLES[prefix]
  assert any(importlib.util.find_spec(h) is not None for h in registry.MODULE_RULES[prefix]
             if importlib.util.find_spec(h.rpartition(".")[0] or h) is not None), prefix
  module = importlib.import_module(f"tensorflow.contrib.{prefix}.{module_name}")
  assert module is importlib.import_module(home)
  assert getattr(module, name) is getattr(importlib.import_module(home), name)


def test_a_tpu_module_comes_from_the_estimator_first_then_tensorflow():
  from tensorflow.contrib.tpu.python.tpu import tpu_context
  from tensorflow.contrib.tpu.python.tpu import tpu_function
  assert tpu_context.__name__ == "tensorflow_estimator.python.estimator.tpu.tpu_context"
  assert tpu_function.__name__ == "tensorflow.python.tpu.tpu_function"
  # MODULE_PATHS come first: the estimator module's names through the compat entries.
  from tensorflow.contrib.tpu.python.tpu import tpu_optimizer
  assert tpu_optimizer.CrossShardOptimizer is tf.contrib.tpu.CrossShardOptimizer


@pytest.mark.parametrize("statement", [
    "from tensorflow.compat.v1 import estimator",
    "import tensorflow.compat.v1.estimator as estimator",
])
def test_the_2022_23_import_of_the_estimator_resolves(statement):
  scope = {}
  exec(statement, scope)
  assert scope["estimator"].tpu.TPUEstimator is stacks.estimator.tpu.TPUEstimator
  assert scope["estimator"].Estimator is stacks.estimator.Estimator
  real_tf = importlib.import_module("tensorflow")
  assert real_tf.compat.v1.estimator.RunConfig is stacks.estimator.RunConfig
  import tensorflow.compat.v2.estimator as v2
  assert v2.DNNClassifier.__name__ == "DNNClassifierV2"
  # tensorflow.estimator stays as the installed TensorFlow has it.
  assert hasattr(real_tf, "estimator") == (stacks.NAME == "tf2.15")


@pytest.mark.parametrize("statement,path,module", [
    ("from tensorflow.contrib import gan", "tensorflow.contrib.gan", None),
    ("import tensorflow.contrib.learn", "tensorflow.contrib.learn", None),
    ("from tensorflow.contrib.tpu import keras_to_tpu_model",
     "tensorflow.contrib.tpu.keras_to_tpu_model", "tpu"),
    ("from tensorflow.contrib.tpu.python.tpu.tpu_estimator import export_estimator_savedmodel",
     "tensorflow.contrib.tpu.python.tpu.tpu_estimator.export_estimator_savedmodel", "tpu"),
])
def test_a_refused_path_fails_saying_what_to_use_instead(statement, path, module):
  leaf = path.rsplit(".", 1)[1]
  entries = registry.CONTRIB if module is None else registry.CONTRIB[module]
  with pytest.raises(ImportError) as err:
    exec(statement, {})
  assert str(err.value) == _lazy.refused_message(path, entries[leaf].note)
  attribute_path = "tf.contrib." + (leaf if module is None else f"{module}.{leaf}")
  with pytest.raises(AttributeError) as attribute_err:
    getattr(tf.contrib if module is None else getattr(tf.contrib, module), leaf)
  assert str(attribute_err.value) == str(err.value).replace(path, attribute_path)


def test_module_paths_need_the_compat_import_and_nothing_else():
  code = ("import importlib.util, sys\n"
          "try:\n  import tensorflow.contrib\nexcept ImportError:\n  print('no contrib')\n"
          "import estimator_tpu.compat\n"
          "from tensorflow.contrib.tpu.python.tpu import async_checkpoint\n"
          "print(async_checkpoint.AsyncCheckpointSaverHook.__module__)\n")
  # A bare environment, but for libtpu's switches: this program imports TensorFlow before
  # estimator_tpu, and the tpu stack's TensorFlow must not ask a metadata server for a TPU.
  switches = {name: os.environ[name] for name in libtpu_guard.VARIABLES if name in os.environ}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True, env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1",
                                         "PATH": "/usr/bin", **switches})
  assert done.stdout.split() == ["no", "contrib", "estimator_tpu.compat.checkpoint_hooks"]


@pytest.mark.parametrize("path,name", registry.V1_EXAMPLES)
def test_tf_1_public_module_paths_are_tf_compat_v1s_modules(path, name):
  module = importlib.import_module(f"tensorflow.{path}")
  v1 = importlib.import_module("tensorflow").compat.v1
  for part in path.split("."):
    v1 = getattr(v1, part)
  assert module is v1
  assert getattr(module, name) is getattr(v1, name)


def test_tf_1_module_paths_by_from_import_and_tensorflows_own_modules_win():
  from tensorflow.gfile import Exists
  from tensorflow.saved_model import loader
  real_tf = importlib.import_module("tensorflow")
  assert Exists is real_tf.compat.v1.gfile.Exists
  assert loader is real_tf.compat.v1.saved_model.loader
  import tensorflow.io
  import tensorflow.summary
  assert tensorflow.io.write_file is real_tf.io.write_file
  assert tensorflow.summary.create_file_writer is real_tf.summary.create_file_writer
  with pytest.raises(ImportError):
    import tensorflow.no_such_module  # noqa: F401
  if stacks.NAME != "tf2.15":  # the estimator's v1 API is this package's alias, not TF's
    with pytest.raises(ImportError):
      import tensorflow.estimator  # noqa: F401
    assert not hasattr(real_tf, "estimator")


def test_compat_check_reports_tf_1_module_paths_mapped(tmp_path):
  from estimator_tpu.compat import check
  program = tmp_path / "paths.py"
  program.write_text("from estimator_tpu.compat import tf\n"
                     "from tensorflow.gfile import Exists, MakeDirs\n"
                     "import tensorflow.logging as logging\n"
                     "from tensorflow.python.eager import profiler\n"
                     "Exists('x'), logging.info, profiler.start\n")
  lines = []
  assert check.main([str(program)], out=lines.append) == 0, lines
  assert lines[-1].endswith("runs with only its import line changed")


def test_every_tf_1_public_module_path_imports_with_all_its_names():
  """The rule behind V1_EXAMPLES, checked against the installed TensorFlow's tf.compat.v1.

  Every module of tf.compat.v1 that TensorFlow has no module of its own for
  imports as `tensorflow.<name>` and gives each name `tf.<name>` has, by
  `from tensorflow.<name> import <attribute>` as well.
  """
  real_tf = importlib.import_module("tensorflow")
  v1 = real_tf.compat.v1
  checked = []
  for name in sorted(dir(v1)):
    value = getattr(v1, name)
    if (name.startswith("_") or not isinstance(value, types.ModuleType)
        or name in registry.TF_OWN_PACKAGES or name in ("estimator", "keras")
        or importlib.machinery.PathFinder.find_spec(f"tensorflow.{name}", real_tf.__path__)):
      continue
    module = importlib.import_module(f"tensorflow.{name}")
    assert module is value, name
    for attribute in (a for a in dir(value) if not a.startswith("_")):
      assert getattr(module, attribute) is getattr(value, attribute), f"{name}.{attribute}"
    checked.append(name)
  assert {"app", "gfile", "logging", "layers", "losses"} <= set(checked), checked
