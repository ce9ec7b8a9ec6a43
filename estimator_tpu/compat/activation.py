"""What the first use of `estimator_tpu.compat.tf` sets up for the process: TF 1 graphs, quiet.

- Graph mode, as TF 1 ran: eager execution off, by TensorFlow's own switch
  (`tf.compat.v1.disable_eager_execution()`), so a script's top-level graph code
  (`tf.placeholder`, `tf.Session`, `tf.summary.FileWriter`, `tf.train.Saver`)
  runs as written. Estimators build their own graphs and run the same either way.
  The switch is process-wide; ESTIMATOR_TPU_COMPAT_EXECUTION=eager keeps eager
  execution on (for TF 2 code in the same process, or a test process). Under
  ESTIMATOR_TPU_ENGINE=distribute too the program keeps graph mode: the engine
  enters an eager context of its own for what it does
  (estimator_tpu.engines.distribute.eager).
- TF 1 TensorShape semantics: `shape[-1].value`, `tf.Dimension`, iteration
  over Dimensions, Dimension arithmetic and comparisons, exactly as TF 1.15 had
  them, by TensorFlow's own switch (`tf.compat.v1.disable_v2_tensorshape()`,
  what `tf.compat.v1.disable_v2_behavior()` also does). The switch is global;
  the library reads shapes only through `as_list()`, `rank` and
  `is_fully_defined()`, which answer the same either way, and
  tests/test_compat_shapes.py runs the input pipeline, model, preflight and
  export both ways and compares.
- Quiet: TensorFlow's deprecation messages ("... is deprecated and will be
  removed", logged by TF or warned by Keras 2's tf.layers, and "The name tf.X is
  deprecated" of the estimator's API modules) are silenced: a legacy program
  uses deprecated names by design, and the message would point at wherever TF
  saw the call, often this package's loader.
- One line per log record: TensorFlow's records print once, through its own
  handler (estimator_tpu.tf_logger), not again through absl's or a root handler.
- TF 1 layer subclasses that override a private Keras hook with its TF 1.15
  signature (`_moments(self, inputs, reduction_axes, keep_dims)`) are called
  with the arguments they take (estimator_tpu.compat.layer_hooks).
- `tf.compat.v1.estimator` and `tf.compat.v2.estimator` are there, as on TF 2.15
  (estimator_tpu.tf_standins).
- `ESTIMATOR_TPU_STRATEGY` (one_device, mirrored, multi_worker, tpu) is checked,
  and with `multi_worker` the MultiWorkerMirroredStrategy of TF_CONFIG's cluster
  is made now, before TensorFlow runs its first op (engines/choose.py).
- One INFO line says the layer is active.

Set ESTIMATOR_TPU_COMPAT_SHAPES=v2 to keep TF 2 shapes (legacy code that
reads `.value` then fails as it would on plain TF 2).
"""

import importlib
import os
import threading
import warnings

from estimator_tpu import tf_logger

SHAPES_ENV = "ESTIMATOR_TPU_COMPAT_SHAPES"
EXECUTION_ENV = "ESTIMATOR_TPU_COMPAT_EXECUTION"
_TF215_ESTIMATOR_V1 = "tensorflow_estimator.python.estimator.api._v1.estimator"
# Keras 2's legacy layers' warnings (tf.layers.dense, and slim's layer.apply).
_KERAS_DEPRECATION = (r"`(tf\.[\w.]+|layer\.apply)` is deprecated and will be removed "
                      r"in a future version")

_lock = threading.Lock()
_active = False


def activate():
  """Sets up the process for TF 1 code; only the first call does anything."""
  global _active
  with _lock:
    if _active:
      return
    _active = True
  import tensorflow as tf
  from tensorflow.python.util import deprecation
  shapes = os.environ.get(SHAPES_ENV, "v1")
  if shapes not in ("v1", "v2"):
    raise ValueError(f"{SHAPES_ENV}={shapes!r} is not a shape mode: use v1 (TF 1 "
                     f"TensorShape, the default) or v2")
  # TensorFlow's own switch, module-global like tensor_shape's; `deprecation.silence()`
  # is the same flag as a context manager, which cannot span a whole program.
  deprecation._PRINT_DEPRECATION_WARNINGS = False
  from estimator_tpu import stacks
  # TF 2.15's own tf.compat.v1.estimator is this API module tree ("TPUConfig is deprecated").
  if stacks.NAME == "tf2.15":
    importlib.import_module(_TF215_ESTIMATOR_V1)
    quiet_api_modules(_TF215_ESTIMATOR_V1)
    quiet_api_modules(stacks.estimator.__name__)  # the tree stacks.tpu is (the engines read it)
  # ESTIMATOR_TPU_STRATEGY checked, and a multi-worker cluster set up before TensorFlow starts
  # its runtime (below, graph mode and Keras' layers do); the engines read the names above.
  from estimator_tpu.engines import choose
  choose.prepare_program_strategy()
  execution = os.environ.get(EXECUTION_ENV, "graph")
  if execution not in ("graph", "eager"):
    raise ValueError(f"{EXECUTION_ENV}={execution!r} is not an execution mode: use graph "
                     f"(TF 1's, the default) or eager")
  if shapes == "v1":
    tf.compat.v1.disable_v2_tensorshape()
  if execution == "graph":
    tf.compat.v1.disable_eager_execution()
  tf_logger.print_once()
  from estimator_tpu import tf_standins
  from estimator_tpu.compat import layer_hooks
  layer_hooks.install(stacks.keras.layers.Layer)
  tf_standins.restore_estimator_attributes()
  # Keras 2's legacy layers say the same through Python warnings, once per call site.
  warnings.filterwarnings("ignore", message=_KERAS_DEPRECATION, category=UserWarning)
  tf_logger.info("estimator_tpu.compat active: TF %s as tf.compat.v1 with tf.contrib, "
               "%s, TF 1 shapes %s, deprecation messages off (docs/MIGRATING.md)",
               tf.__version__, "graph mode" if execution == "graph" else "eager execution on",
               "on" if shapes == "v1" else "off")


def quiet_api_modules(prefix):
  """Turns off the "The name tf.X is deprecated" message of TF API modules under prefix.

  TensorFlow's generated API modules (TFModuleWrapper) print it per module,
  naming whoever touched the name first, which for a mapped name is this
  package's loader; the flag is the wrapper's own.
  """
  import sys
  for name, module in list(sys.modules.items()):
    if (name == prefix or name.startswith(prefix + ".")) and hasattr(
        module, "_tfmw_print_deprecation_warnings"):
      module._tfmw_print_deprecation_warnings = False


def active():
  return _active
