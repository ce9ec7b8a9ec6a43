"""Every stack: the estimator API, Keras 2 in either import order, and the TF stand-ins."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

from packaging import version as packaging_version
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu import tf_standins
from estimator_tpu.tf_standins import _refusal
from estimator_tpu.tf_standins import estimator_training
from estimator_tpu.tf_standins import session_support
from estimator_tpu.tf_standins import tpu_embedding
from estimator_tpu.tf_standins import tpu_embedding_gradient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints what a user's program sees of Keras and the estimator after `first`.
_PROBE = """
import json, sys
{first}
import tensorflow as tf
import estimator_tpu
dense = tf.keras.layers.Dense
top = dense.__module__.split(".")[0]
with tf.Graph().as_default():
  layers = tf.compat.v1.layers.dense(tf.compat.v1.placeholder(tf.float32, [None, 3]), 2)
from estimator_tpu import stacks
print(json.dumps({{"package": top, "version": sys.modules[top].__version__,
                  "same_as_ours": dense is stacks.keras.layers.Dense,
                  "v1_layer_shape": layers.shape.as_list()}}))
"""


def _probe(first):
  code = _PROBE.format(first=first)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_USE_LEGACY_KERAS", None)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=300, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("first", ["import estimator_tpu", "import tensorflow"],
                         ids=["estimator_tpu_first", "tensorflow_first"])
def test_tf_keras_is_keras_2_whichever_is_imported_first(first):
  seen = _probe(first)
  assert seen["version"].startswith("2."), seen
  assert seen["same_as_ours"], seen
  assert seen["v1_layer_shape"] == [None, 2]
  assert seen["package"] == ("tf_keras" if stacks.KERAS_2_IS_TF_KERAS else "keras")


def _installed(distribution):
  wanted = distribution.replace("_", "-")
  return any((d.metadata["Name"] or "").lower().replace("_", "-") == wanted
             for d in importlib.metadata.distributions())


def test_stack_name_follows_the_tensorflow_version_and_build():
  major_minor = tuple(int(p) for p in tf.__version__.split(".")[:2])
  if major_minor < (2, 16):
    expected = "tf2.15"
  else:
    expected = "tpu" if _installed("tensorflow-tpu") else "current"
  assert stacks.NAME == expected
  assert stacks.KERAS_2_IS_TF_KERAS == (major_minor >= (2, 16))
  assert stacks.describe().startswith(f"stack {stacks.NAME}: TensorFlow {tf.__version__}")
  # The TPU build is the one whose name is not `tensorflow`: describe() names it and its libtpu.
  if stacks.NAME == "tpu":
    assert not _installed("tensorflow")
    assert f"tensorflow-tpu {tf.__version__}" in stacks.describe()
    assert f"libtpu {importlib.metadata.version('libtpu')}" in stacks.describe()


def test_host_xla_is_missing_only_from_the_tpu_build():
  compiled = tf.function(lambda x: x * 2.0, jit_compile=True)
  if stacks.HOST_XLA:
    assert float(compiled(tf.constant(3.0))) == 6.0
  else:
    with pytest.raises(tf.errors.NotFoundError, match="transfer manager for platform Host"):
      compiled(tf.constant(3.0))


def test_one_estimator_namespace_with_the_tpu_classes():
  est = stacks.estimator
  assert stacks.tpu.TPUEstimator.__module__.endswith("tpu.tpu_estimator")
  assert issubclass(stacks.tpu.TPUEstimator, est.Estimator)
  assert est.ModeKeys.TRAIN == "train" and stacks.ModeKeys is est.ModeKeys
  assert callable(est.train_and_evaluate) and est.export.PredictOutput


def test_compat_tf_offers_tf_estimator_on_both_stacks():
  from estimator_tpu.compat import tf as compat_tf
  assert compat_tf.estimator is stacks.estimator
  assert compat_tf.contrib.tpu.TPUEstimator is stacks.tpu.TPUEstimator
  assert compat_tf.estimator.tpu.RunConfig is stacks.tpu.RunConfig


def test_standins_serve_only_what_tensorflow_lacks():
  from tensorflow.python.eager import profiler  # the one the estimator does not import
  served = tf_standins.active()
  if stacks.KERAS_2_IS_TF_KERAS:
    assert served == sorted(tf_standins.STANDINS)
  else:
    assert served == []
    from tensorflow.python.tpu import session_support as real
    assert real.__name__ == "tensorflow.python.tpu.session_support"
  # TF 2.21 dropped it, and so did TF 2.20's TPU build.
  assert profiler.__name__ == ("estimator_tpu.tf_standins.eager_profiler"
                               if stacks.NAME in ("current", "tpu")
                               else "tensorflow.python.eager.profiler")


def test_standin_finder_is_installed_once_after_the_real_modules_finder():
  tf_standins.install()
  tf_standins.install()
  finders = [f for f in sys.meta_path if isinstance(f, tf_standins.StandinFinder)]
  path_finder = next(f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder")
  assert len(finders) == 1
  assert sys.meta_path.index(finders[0]) > sys.meta_path.index(path_finder)


# --- what each stand-in does ---------------------------------------------------


def test_tpu_embedding_builds_its_configuration_and_refuses_the_engine():
  assert tpu_embedding.AdagradParameters(0.1).initial_accumulator == 0.1
  assert tpu_embedding.TableConfig(10, 4).dimension == 4
  with pytest.raises(_refusal.UnavailableOnThisStack,
                     match=r"TPU embeddings .*tpu_embedding\.TPUEmbedding .*tf2\.15 stack"):
    tpu_embedding.TPUEmbedding({}, {}, 8, tpu_embedding.TRAINING)
  with pytest.raises(_refusal.UnavailableOnThisStack, match=r"tpu_embedding\.TPUEmbeddingV9"):
    tpu_embedding.TPUEmbeddingV9  # noqa: B018 -- the attribute access is what raises
  with pytest.raises(AttributeError):
    tpu_embedding.__wrapped__  # noqa: B018 -- the attribute access is what raises
  with pytest.raises(_refusal.UnavailableOnThisStack, match="create_dummy_table_variables"):
    tpu_embedding_gradient.create_dummy_table_variables(None)


def test_graceful_shutdown_refuses_an_asked_for_mode(monkeypatch):
  monkeypatch.setenv(session_support.MODE_VARIABLE, "shutdown_all_workers")
  with pytest.raises(_refusal.UnavailableOnThisStack,
                     match=r"graceful shutdown \(TF_TPU_GRACEFUL_SHUTDOWN_MODE="
                           r"shutdown_all_workers\).*tf2\.15 stack"):
    session_support.GracefulShutdownHook("/tmp/model.ckpt")
  with pytest.raises(_refusal.UnavailableOnThisStack, match="watchdog"):
    session_support.start_worker_watchdog(None, shutdown_timeout=10)


def test_graceful_shutdown_default_says_once_that_nothing_is_watched(monkeypatch, caplog):
  monkeypatch.delenv(session_support.MODE_VARIABLE, raising=False)
  hook = session_support.GracefulShutdownHook(
      "/m/model.ckpt", on_shutdown_hooks=[session_support.ResetComputation()])
  with caplog.at_level("WARNING", logger="estimator_tpu"):
    hook.begin()
  assert [r.getMessage().split(" is not")[0] for r in caplog.records] == [session_support.FEATURE]
  with pytest.raises(_refusal.UnavailableOnThisStack, match="ResetComputation"):
    hook.on_shutdown_hooks[0](None, [], [])


def test_global_ids_put_chief_first_and_ps_last():
  cluster = tf.train.ClusterSpec({"chief": ["c:1"], "worker": ["w:1", "w:2"],
                                  "ps": ["p:1", "p:2"], "evaluator": ["e:1"]})
  ids = {(job, i): estimator_training.global_id(cluster, job, i)
         for job in cluster.jobs for i in range(len(cluster.job_tasks(job)))}
  # chief 0; evaluator and worker sorted by name: evaluator 1, worker 2-3; ps 4-5.
  assert ids == {("chief", 0): 0, ("evaluator", 0): 1, ("worker", 0): 2,
                 ("worker", 1): 3, ("ps", 0): 4, ("ps", 1): 5}
  assert estimator_training.global_id(cluster, None, None) == 0
  with pytest.raises(ValueError, match="'master' is not a job"):
    estimator_training.global_id(cluster, "master", 0)


def test_run_config_with_a_cluster_and_a_strategy_runs_the_coordinator(monkeypatch):
  cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"]}
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                              "task": {"type": "worker", "index": 0}}))
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  config = stacks.estimator.RunConfig(train_distribute=strategy)
  assert config._distribute_coordinator_mode == "independent_worker"
  assert estimator_training.should_run_distribute_coordinator(config)
  assert config.cluster_spec.as_dict() == cluster
  local = stacks.estimator.RunConfig()
  assert not estimator_training.should_run_distribute_coordinator(local)
  assert local.task_type == "worker" and local.task_id == 0 and local.num_worker_replicas == 2
  assert not local.is_chief


def test_the_package_metadata_names_this_stacks_estimator():
  wanted = "tf-estimator-nightly" if stacks.KERAS_2_IS_TF_KERAS else "tensorflow-estimator"
  assert importlib.metadata.version(wanted)


def test_the_tf_2_0_profiler_api_profiles_and_saves_for_tensorboard(tmp_path):
  import tensorflow as tf
  from tensorflow.python.eager import profiler
  with pytest.raises(profiler.ProfilerNotRunningError):
    profiler.stop()
  with profiler.Profiler(str(tmp_path)):
    with pytest.raises(profiler.ProfilerAlreadyRunningError):
      profiler.start()
    tf.reduce_sum(tf.ones([8, 8])).numpy()
  traces = list(tmp_path.glob("plugins/profile/*/local.trace"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0
  assert len(list(tmp_path.glob("events*.profile-empty"))) == 1
  profiler.start()
  assert isinstance(profiler.stop(), bytes)


def test_describe_names_the_distributions_installed_whatever_they_are_called(monkeypatch):
  installed = {"tensorflow": ["tf-nightly"], "tensorflow_estimator": ["tf-estimator-nightly"],
               "tf_keras": ["tf-keras-nightly"], "keras": ["keras-nightly"]}
  versions = {"tf-nightly": "2.23.0.dev20261026", "tf-estimator-nightly": "2.16.0.dev1",
              "tf-keras-nightly": "2.23.0.dev2", "keras-nightly": "3.13.0.dev3"}
  monkeypatch.setattr(stacks.metadata, "packages_distributions", lambda: installed)
  monkeypatch.setattr(stacks.metadata, "version", versions.__getitem__)
  line = stacks.describe()
  assert "tf-nightly 2.23.0.dev20261026, tf-estimator-nightly 2.16.0.dev1" in line
  assert ("tf-keras-nightly 2.23.0.dev2" if stacks.KERAS_2_IS_TF_KERAS else
          "keras-nightly 3.13.0.dev3") in line


# The import packages each stack is made of, beside the rest of its lock.
STACK_PACKAGES = {"current": ("tensorflow", "tensorflow_estimator", "tf_keras"),
                  "tpu": ("tensorflow", "tensorflow_estimator", "tf_keras", "libtpu"),
                  "tf2.15": ("tensorflow", "tensorflow_estimator", "keras")}


def _pip_name(name):
  return re.sub(r"[-_.]+", "-", name).lower()


def _owner(package):
  """(distribution, version) whose installed files hold import package `package` (RECORD)."""
  owners = {(_pip_name(d.metadata["Name"]), d.version) for d in importlib.metadata.distributions()
            if any(f.parts[0] == package and f.name == "__init__.py" for f in d.files or ())}
  assert len(owners) == 1, f"{package}: installed by {owners or 'no distribution'}"
  return owners.pop()


def _lock_pins(stack):
  """{distribution: version} that requirements/<stack>.lock pins."""
  pins = {}
  with open(os.path.join(REPO, "requirements", f"{stack}.lock")) as f:
    for line in f:
      name, _, version = line.split("#")[0].strip().partition("==")
      if version:
        pins[_pip_name(name)] = version.strip()
  return pins


def test_describe_names_the_distributions_that_installed_this_stacks_packages():
  """Whatever their names (a nightly's are not the lock's); a distribution the lock pins has
  the lock's version."""
  line = stacks.describe()
  pins = _lock_pins(stacks.NAME)
  for package in STACK_PACKAGES[stacks.NAME]:
    name, version = _owner(package)
    assert f"{name} {version}" in line, line
    if name in pins:
      assert version == pins[name], f"{name} {version}: {stacks.NAME}.lock pins {pins[name]}"
  _, tf_version = _owner("tensorflow")
  assert packaging_version.Version(tf_version) == packaging_version.Version(tf.__version__)
