"""TensorFlow's native start-up lines, kept off stderr where they start: while its libraries load.

TF 2.21 logs through absl's C++ logging, and its shared libraries log from
static initialisers, before `absl::InitializeLog()` runs and so before
TF_CPP_MIN_LOG_LEVEL applies: on CPUs with AVX-512/AMX (or any x86 CPU with
TF_ENABLE_ONEDNN_OPTS=1) every process that imports TensorFlow gets

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1795532337.936775    2176 port.cc:153] oneDNN custom operations are on. ...

once when `import tensorflow` loads libtensorflow_framework, and again from
each native module with its own copy of absl (the profiler plugin, loaded when
`tf.profiler` is first touched). TF 2.15 writes its own format at import
(`2026-11-24 15:01:27.98: I tensorflow/core/util/port.cc:113] oneDNN ...`, and
on the full wheel "Unable to register cuDNN factory" errors).

`install()` adds an import hook. `import tensorflow`, and every later load of
one of TensorFlow's native extension modules, run with file descriptor 2
captured (a memory file, no thread); the C++ log records written meanwhile,
INFO to ERROR in any of those formats with their continuation lines, are
dropped, and everything else (a FATAL record, a Python warning, a traceback)
is written to stderr as it came. Nothing is captured afterwards: C++ messages
that come later print as TF_CPP_MIN_LOG_LEVEL says. oneDNN stays as TensorFlow
chose it. ESTIMATOR_TPU_TF_STARTUP_LOGS=1 shows the start-up lines again.

The tpu stack's TensorFlow (2.20), with libtpu left unloaded on a host
without a TPU (estimator_tpu.libtpu_guard), looks for a TPU platform the
first time it lists devices, logging five tries a second apart, and logs an
MLIR line at its first graph run whatever TF_CPP_MIN_LOG_LEVEL says; the
import does both inside the capture, so those lines and that wait come with it.

TF 2.15 logs one more such line, through a copy of absl inside
libtensorflow_cc that nothing outside can configure, at the first XLA
compile of a process ("Compiled cluster using XLA!  This line is logged at
most once for the lifetime of the process."): `quiet_first_xla_compile()`,
called where this package is about to use XLA, compiles a one-op cluster
inside the capture first.
"""

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
import threading

from estimator_tpu import keras_loaders
from estimator_tpu import libtpu_guard

SHOW_ENV = "ESTIMATOR_TPU_TF_STARTUP_LOGS"
PACKAGE = "tensorflow"

# absl / glog: "I0000 00:00:1795532337.936775    2176 port.cc:153] ..."
_ABSL_RECORD = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\]\s]+:\d+\] ")
# TF <= 2.15: "2026-11-24 15:01:27.982633: I tensorflow/core/util/port.cc:113] ..."
_TF_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) [^\]\s]+:\d+\] ")
_ABSL_NOTICE = ("WARNING: All log messages before absl::InitializeLog() is called are "
                "written to STDERR")
# Lines Python itself writes to stderr: they end a C++ record's continuation lines.
_PYTHON_LINE = re.compile(r"^(Traceback \(most recent call last\):|\S+:\d+: \w*(Warning|Error): )")
_DROPPED = frozenset("IWE")

_lock = threading.Lock()
_installed = False
_xla_warmed = False
_depth = 0
_saved_fd = None
_capture = None


def filter_startup_lines(text):
  """text written to stderr while TensorFlow loaded -> what the user should still see.

  Drops absl's notice and the C++ log records below FATAL, each with the lines
  that continue it (up to the next record or a line Python wrote).
  """
  kept, dropping = [], False
  for line in text.splitlines(keepends=True):
    bare = line.rstrip("\r\n")
    match = _ABSL_RECORD.match(bare) or _TF_RECORD.match(bare)
    if match:
      dropping = match.group(1) in _DROPPED
    elif bare == _ABSL_NOTICE:
      dropping = True
    elif _PYTHON_LINE.match(bare):
      dropping = False
    if not dropping:
      kept.append(line)
  return "".join(kept)


def _begin():
  """Points fd 2 at a memory file; returns False where that cannot be done."""
  global _saved_fd, _capture
  try:
    capture = (os.memfd_create("tf_startup") if hasattr(os, "memfd_create")
               else os.dup(tempfile.TemporaryFile().fileno()))
  except OSError:
    return False
  sys.stderr.flush()
  _saved_fd = os.dup(2)
  os.dup2(capture, 2)
  _capture = capture
  return True


def _end():
  """Puts fd 2 back and writes what was captured, less the start-up lines."""
  global _saved_fd, _capture
  with contextlib.suppress(ValueError, OSError):
    sys.stderr.flush()
  os.dup2(_saved_fd, 2)
  os.close(_saved_fd)
  size = os.lseek(_capture, 0, os.SEEK_END)
  os.lseek(_capture, 0, os.SEEK_SET)
  data = os.read(_capture, size) if size else b""
  os.close(_capture)
  _saved_fd = _capture = None
  kept = filter_startup_lines(data.decode("utf-8", "replace"))
  if kept:
    os.write(2, kept.encode("utf-8"))


@contextlib.contextmanager
def captured():
  """Runs the block with TensorFlow's C++ start-up records kept off stderr; nests."""
  global _depth
  with _lock:
    _depth += 1
    began = _depth == 1 and _begin()
  try:
    yield
  finally:
    with _lock:
      _depth -= 1
      if began:
        _end()


class _QuietLoader(importlib.abc.Loader):
  """Runs another loader's create_module and exec_module inside `captured()`."""

  def __init__(self, loader):
    self._loader = loader

  def __getattr__(self, name):
    return getattr(self._loader, name)

  def create_module(self, spec):
    with captured():
      return self._loader.create_module(spec)

  def exec_module(self, module):
    try:
      with captured():
        self._loader.exec_module(module)
        if module.__name__ == PACKAGE and libtpu_guard.runs_without_tpu():
          _settle_tpu_build(module)
      if module.__name__ == PACKAGE:
        keras_loaders.settle()  # in this thread, before any other can race for tf.keras
    finally:
      # The module keeps its real loader (importlib.resources and friends ask it).
      module.__loader__ = self._loader
      if getattr(module, "__spec__", None) is not None:
        module.__spec__.loader = self._loader


def _settle_tpu_build(tf):
  """The TPU build with libtpu unloaded: what it logs once per process, logged inside the capture.

  Its first device listing looks for a TPU platform for 4 s and logs each
  try; its first graph run logs "MLIR V1 optimization pass is not enabled"
  through absl before absl::InitializeLog, whatever TF_CPP_MIN_LOG_LEVEL says.
  The graph run is a one-op graph and session of its own (no eager context).
  """
  tf.config.list_physical_devices()
  with tf.Graph().as_default() as graph:
    one = tf.constant(1.0) + 1.0
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(one)


def _watched(fullname, spec):
  if fullname == PACKAGE:
    return True
  return (fullname.startswith(PACKAGE + ".")
          and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader))


class StartupFinder(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` and its native modules through the other finders; loads them quietly."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None:
        break
    else:
      return None
    if spec.loader is not None and _watched(fullname, spec):
      spec.loader = _QuietLoader(spec.loader)
    return spec


def install():
  """Adds the hook once, first in sys.meta_path; a no-op with ESTIMATOR_TPU_TF_STARTUP_LOGS=1."""
  global _installed
  if os.environ.get(SHOW_ENV, "") not in ("", "0"):
    return
  if not any(isinstance(finder, StartupFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, StartupFinder())
  _installed = True


def quiet_first_xla_compile():
  """On TF < 2.16, compiles a one-op XLA cluster inside the capture, once per process.

  In a graph and session of its own, so it works in any context (eager, an
  Estimator's graph) and sets up nothing the program's own devices depend on.
  """
  global _xla_warmed
  with _lock:
    if _xla_warmed or not _installed:
      return
    _xla_warmed = True
  import tensorflow as tf
  if tuple(int(part) for part in tf.__version__.split(".")[:2]) >= (2, 16):
    return
  with captured(), tf.Graph().as_default() as graph:
    # A one-shot iterator asks for a seed, which under op determinism
    # (--deterministic) must be set: this throwaway graph's own.
    tf.compat.v1.set_random_seed(0)
    # Where this package uses XLA on the host: a jit-compiled function in tf.data
    # (a jit-compiled function called straight from a v1 graph compiles quietly).
    plus_one = tf.function(lambda x: x + 1.0, jit_compile=True)
    dataset = tf.data.Dataset.from_tensors(tf.constant(1.0)).map(plus_one)
    one = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(one)
