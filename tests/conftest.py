"""Shared fixtures: small real-JPEG data sets, trained model dirs, exports; made once a session."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
import timings

from estimator_tpu import config as config_lib
from estimator_tpu import testing
from estimator_tpu.run import assemble

# The compat `tf` turns eager execution off for its process, as TF 1 ran; a test process
# also runs the library's TF 2 code, so it keeps eager execution on. Programs the tests
# start (program_env) get the default, graph mode, as a user's program does.
_EXECUTION_ENV = "ESTIMATOR_TPU_COMPAT_EXECUTION"
os.environ.setdefault(_EXECUTION_ENV, "eager")
# No progress lines in what tests read, unless a test asks for them (estimator_tpu/progress.py).
os.environ.setdefault("ESTIMATOR_TPU_PROGRESS_SECS", "0")

NUM_TRAIN = 200
NUM_EVAL = 37
IMAGE_SIZE = 32


def program_env(**extra):
  """The environment of a program whose output a test reads: that of an AVX-512/AMX host.

  TF_ENABLE_ONEDNN_OPTS=1 makes TensorFlow print, on any x86 CPU, the C++
  start-up lines TF 2.21 prints by default on CPUs with AVX-512 or AMX (most
  current cloud VMs): a test that read the output without it would pass only
  on hosts like the one it was written on.
  """
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1")
  del env[_EXECUTION_ENV]  # set for this process (above), also in xdist's workers
  env.update(extra)
  return env


def pytest_addoption(parser):
  parser.addoption("--timings", metavar="PATH",
                   help="write each test phase's wall and CPU seconds, programs started and "
                   "in-process training/export/Beam seconds to PATH as JSON lines "
                   "(tests/timings.py; `python tests/timings.py PATH` sums them)")


_CONFIG = {}


def pytest_configure(config):
  _CONFIG["config"] = config
  path = config.getoption("timings")
  if path:
    if not hasattr(config, "workerinput"):  # the controller, or the only process
      open(path, "w").close()
    timings.install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
  with timings.measured(item, "setup"):
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  with timings.measured(item, "call"):
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
  with timings.measured(item, "teardown"):
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  report = yield
  if item.config.getoption("timings"):
    timings.attach(item, report)
  return report


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config, items):
  """The longest test files first (tests/durations.json), for xdist to balance its workers."""
  del config
  timings.longest_first(items, timings.read_durations(
      os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")))


def pytest_runtest_logreport(report):
  config = _CONFIG.get("config")
  if config is not None and config.getoption("timings") and not hasattr(config, "workerinput"):
    timings.write(config.getoption("timings"), report)


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
  """preprocess.py's layout: 200 train and 37 validation 32x32 digit JPEGs, 10 classes."""
  return testing.write_digits_dataset(str(tmp_path_factory.mktemp("digits")),
                                      num_train=NUM_TRAIN, num_eval=NUM_EVAL,
                                      size=IMAGE_SIZE)


@pytest.fixture(autouse=True, scope="module")
def _tensor_shapes_as_found():
  """Puts back, after each test module, the TensorShape mode it started with.

  The first use of estimator_tpu.compat.tf turns on TF 1 shapes for the process
  (tests/test_compat_shapes.py shows the library does not mind); this keeps a
  module's shapes from depending on the order the modules run in.
  """
  from tensorflow.python.framework import tensor_shape
  before = tensor_shape._TENSORSHAPE_V2_OVERRIDE
  yield
  tensor_shape._TENSORSHAPE_V2_OVERRIDE = before


def summary_tags(model_dir):
  """The tags of every summary in model_dir's host_call event files (*.v2)."""
  import glob

  import tensorflow as tf
  tags = set()
  for path in glob.glob(os.path.join(model_dir, "events.*.v2")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags


def summary_scalars(model_dir, tag):
  """{step: value} of one scalar tag in model_dir's host_call event files (*.v2)."""
  import glob

  import tensorflow as tf
  values = {}
  for path in glob.glob(os.path.join(model_dir, "events.*.v2")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = float(tf.make_ndarray(value.tensor))
  return values


def fixed_input_fn(params, examples=64):
  """An input_fn of the same batches in the same order on every call.

  `examples` seeded normal images (IMAGE_SIZE, 3 channels) and labels in 0..9,
  repeated, batched by params["batch_size"]: no shuffle, no augmentation.
  """
  import numpy as np
  import tensorflow as tf
  rng = np.random.default_rng(0)
  images = rng.normal(size=(examples, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
  labels = rng.integers(0, 10, size=examples).astype(np.int32)
  dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
  return dataset.repeat().batch(params["batch_size"], drop_remainder=True)


def tiny_config(model_dir, **train):
  """A validated Config for the tiny network on the digits fixture (10 classes)."""
  settings = dict(train_steps=2, steps_per_eval=2, train_batch_size=8, summary_every_n_steps=1,
                  eval_batch_size=8, seed=1)
  settings.update(train)
  return (config_lib.Config()
          .replace("data", image_size=IMAGE_SIZE, num_label_classes=10,
                   class_names=tuple(str(i) for i in range(10)),
                   num_eval_examples=NUM_EVAL, random_flip=False)
          .replace("model", model="tiny", dropout_rate=0.0)
          .replace("train", **settings)
          .replace("runtime", model_dir=str(model_dir), iterations_per_loop=2)
          .validate())


# --- trained model dirs, made once a session and shared ----------------------------------------
# train.py's flags for the tiny network on the digits fixture; a test adds its own.
TINY_FLAGS = ("--model=tiny", f"--image_size={IMAGE_SIZE}", "--train_batch_size=8",
              "--eval_batch_size=8", "--norandom_flip", "--seed=1")


def train_flags(*args):
  """train.py's parsed flags (absl FlagValues) for `train.py ARGS`."""
  from absl import flags

  from estimator_tpu import flags as flags_lib
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", *args])
  return flag_values


def copy_model_dir(source, destination):
  """A copy of the model dir `source` at `destination`, as if it had been trained there.

  For a test that changes a shared model dir (resumes it, damages a checkpoint):
  the files are copied and config.json names `destination` as its model_dir
  (checkpoint paths in a model dir are relative already). Returns destination.
  """
  import shutil
  shutil.copytree(source, destination)
  saved = config_lib.read_config(destination)
  if saved is not None:
    config_lib.write_config(saved.replace("runtime", model_dir=str(destination)))
  return str(destination)


class TrainedModels:
  """Model dirs that train.py trained in this process, once a session for each list of flags.

  `get(*flags)` returns the model dir of `train.py --data_dir=DIGITS
  --model_dir=NEW *base_flags *flags` (base_flags: TINY_FLAGS unless given; later
  flags win), training it on first use; tests read it and never change it.
  `copy(destination, *flags)` is a private copy (copy_model_dir) for a test that
  changes the model dir. What train.py printed is kept in `output[flags]`, out of
  the asking test's capsys.
  """

  def __init__(self, root, data_dir, base_flags=TINY_FLAGS):
    self._root, self._data_dir, self._base_flags = root, data_dir, tuple(base_flags)
    self._dirs = {}
    self.output = {}

  def get(self, *flags):
    import contextlib
    import io

    from estimator_tpu.cli import train
    if flags not in self._dirs:
      model_dir = os.path.join(self._root, f"model{len(self._dirs)}")
      printed = io.StringIO()
      with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        status = train.run(train_flags(f"--data_dir={self._data_dir}",
                                       f"--model_dir={model_dir}", *self._base_flags, *flags))
      self.output[flags] = printed.getvalue()
      assert status == 0, f"train.py {' '.join(flags)} exited {status}:\n{printed.getvalue()}"
      self._dirs[flags] = model_dir
    return self._dirs[flags]

  def copy(self, destination, *flags):
    return copy_model_dir(self.get(*flags), destination)


@pytest.fixture(scope="session")
def trained_models(tmp_path_factory, digits_dir):
  """The session's TrainedModels on the digits fixture (see TrainedModels)."""
  return TrainedModels(str(tmp_path_factory.mktemp("trained_models")), digits_dir)


@pytest.fixture(scope="session")
def trained_model_dir(trained_models):
  """A model_dir where train.py trained the tiny network 4 steps, with config.json."""
  return trained_models.get("--train_steps=4", "--steps_per_eval=4", "--summary_every_n_steps=1")


@pytest.fixture(scope="session")
def exported_model(tmp_path_factory, trained_model_dir):
  """The SavedModel version dir export.py writes for trained_model_dir (signatures, warm-up)."""
  from estimator_tpu.export import saved_model as export_lib
  export_dir = str(tmp_path_factory.mktemp("export"))
  config, checkpoint = assemble.prepare_export(trained_model_dir, export_dir)
  return export_lib.export_saved_model(assemble.build(config), export_dir,
                                       config.data.image_size, checkpoint_path=checkpoint)


# --- preprocess.py / beam_pipeline.py fixtures --------------------------------
# A class-folder tree with good and bad inputs; the expected outcome of each
# file is in IMAGE_FOLDER_EXPECTED (class -> images written) and
# IMAGE_FOLDER_REJECTED (relative path -> reason code).
IMAGE_FOLDER_CLASSES = ["cat", "dog", "ñandú"]
IMAGE_FOLDER_EXPECTED = {"cat": 10, "dog": 8, "ñandú": 9}
IMAGE_FOLDER_REJECTED = {"cat/empty.jpg": "empty_file",
                         "dog/notes.jpg": "not_an_image",
                         "dog/truncated.jpg": "corrupt_image",
                         "README.txt": "not_in_class_folder"}


def image_bytes(array, fmt="JPEG", mode="RGB", **save_args):
  """Encodes an RGB uint8 array in `fmt` after converting it to `mode`."""
  import io

  from PIL import Image
  buffer = io.BytesIO()
  Image.fromarray(array, "RGB").convert(mode).save(buffer, format=fmt,
                                                   **save_args)
  return buffer.getvalue()


def write_image_folder(root):
  """Writes the tree described above under root; returns root."""
  from estimator_tpu.data import digits as datasets
  images, _ = datasets.digit_arrays(limit=30, size=32)
  files = {}
  for c, name in enumerate(IMAGE_FOLDER_CLASSES):
    for i in range(8):
      stem = f"pájaro {i}" if name == "ñandú" else f"{i:02d}"
      files[f"{name}/{stem}.jpg"] = datasets.encode_jpeg(images[c * 8 + i])
  files.update({
      "cat/gray.jpg": image_bytes(images[24], mode="L"),
      "cat/cmyk.jpg": image_bytes(images[25], mode="CMYK"),
      "cat/empty.jpg": b"",
      "dog/notes.jpg": b"not an image at all\n",
      "dog/truncated.jpg": datasets.encode_jpeg(images[26])[:300],
      "ñandú/png_named.jpg": image_bytes(images[27], fmt="PNG"),
      "README.txt": b"class folders below\n",
      "dog/.DS_Store": b"hidden files are skipped",
  })
  for relative, data in files.items():
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(data)
  return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
  """A read-only class-folder tree of 27 good and 4 bad inputs (see above)."""
  return write_image_folder(str(tmp_path_factory.mktemp("image_folder")))
