"""Every stack: tf.keras's lazy loaders choose a Keras before estimator threads race for them."""

import json
import os
import subprocess
import sys

import pytest

from estimator_tpu import stacks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# After the imports, 16 threads reach tf.compat.v1.keras (as the canned estimators' DenseFeatures
# does in each replica thread) at once; the GIL switches as often as it can.
_RACE = """
import json, sys, threading
{first}
from estimator_tpu import keras_loaders
after = len(keras_loaders.unsettled())
sys.setswitchinterval(1e-6)
barrier = threading.Barrier(16)
errors = []
def first_use():
  barrier.wait()
  try:
    tf.compat.v1.keras.layers.DenseFeatures, tf.keras.layers.Dense, tf.compat.v2.keras.Model
  except RecursionError as e:
    errors.append(type(e).__name__)
threads = [threading.Thread(target=first_use) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({{"after": after, "errors": errors,
                   "dense": tf.compat.v1.keras.layers.DenseFeatures.__module__}}))
"""


def _race(first):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_USE_LEGACY_KERAS", None)
  out = subprocess.run([sys.executable, "-c", _RACE.format(first=first)], capture_output=True,
                       text=True, cwd=REPO, env=env, timeout=300, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("first", [
    "import estimator_tpu\nimport tensorflow as tf",
    "import tensorflow as tf\nimport estimator_tpu",
    # TensorFlow's start-up lines shown: no start-up hook; estimator_tpu.stacks settles.
    "import os\nos.environ['ESTIMATOR_TPU_TF_STARTUP_LOGS'] = '1'\nimport estimator_tpu\n"
    "from estimator_tpu import stacks\nimport tensorflow as tf",
], ids=["estimator_tpu_first", "tensorflow_first", "stacks_with_startup_logs"])
def test_no_loader_is_left_for_threads_to_race_for(first):
  seen = _race(first)
  assert seen["after"] == 0 and seen["errors"] == [], seen
  assert seen["dense"].startswith("tf_keras." if stacks.KERAS_2_IS_TF_KERAS else "keras."), seen


def test_a_loader_caught_mid_choice_recurses_and_a_settled_one_does_not(monkeypatch):
  """The race, without threads: the state a second thread finds while the first one chooses."""
  import types

  from tensorflow.python.util import lazy_loader

  from estimator_tpu import keras_loaders
  racing = lazy_loader.KerasLazyLoader({}, mode="v1")
  # TF >= 2.16 prefixes the loader's own attributes with _tfll_; TF 2.15 does not.
  flag = "_tfll_initialized" if "_tfll_initialized" in vars(racing) else "_initialized"
  setattr(racing, flag, True)  # _initialize's first line, before it records the choice
  with pytest.raises(RecursionError):
    racing.layers  # noqa: B018 -- the attribute access is what recurses
  settled = lazy_loader.KerasLazyLoader({}, mode="v1")
  holder = types.ModuleType("tensorflow_settle_probe")
  holder.keras = settled
  monkeypatch.setitem(sys.modules, holder.__name__, holder)
  assert settled in keras_loaders.unsettled()
  assert keras_loaders.settle() >= 1
  setattr(settled, flag, True)  # what a second thread sees now: the choice is recorded
  assert settled.layers.Dense.__module__.startswith(
      "tf_keras." if stacks.KERAS_2_IS_TF_KERAS else "keras.")
