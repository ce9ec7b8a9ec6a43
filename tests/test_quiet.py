"""What a user reads is ours on every host: no TensorFlow start-up lines, each TF log record once.

Every program here runs with TF_ENABLE_ONEDNN_OPTS=1 (conftest.program_env):
TensorFlow 2.21 then prints its C++ start-up lines on any x86 CPU, as it does
by default on CPUs with AVX-512 or AMX.
"""

import os
import subprocess
import sys

from conftest import program_env
import pytest

from estimator_tpu import stacks
from estimator_tpu import tf_startup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TensorFlow writes while it loads, on either stack (TF 2.15's full wheel adds CUDA's).
STARTUP_MARKS = ("oneDNN custom operations", "absl::InitializeLog", "cpu_feature_guard",
                 "Compiled cluster using XLA", "Unable to register cu", "TF-TRT Warning",
                 "cudart_stub")


def _startup_lines(text):
  return [line for line in text.splitlines() if any(mark in line for mark in STARTUP_MARKS)]


def _run(argv, **env):
  """Runs argv in the repo as a user would: no TF_CPP_MIN_LOG_LEVEL unless given."""
  environment = program_env(**env)
  if "TF_CPP_MIN_LOG_LEVEL" not in env:
    environment.pop("TF_CPP_MIN_LOG_LEVEL", None)
  return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=environment)


# --- the filter ------------------------------------------------------------------------------


def test_the_filter_drops_start_up_records_and_keeps_the_rest():
  captured = "".join([
      "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
      "I0000 00:00:1795532337.936775    2176 port.cc:153] oneDNN custom operations are on.\n",
      "I0000 00:00:1795532338.404663    2176 cpu_feature_guard.cc:227] This TensorFlow binary\n",
      "To enable the following instructions: AVX2 FMA, in other operations, rebuild.\n",
      "/x/numpy/core.py:12: UserWarning: a warning of the program's own\n",
      "  warnings.warn('a warning')\n",
      "2026-11-24 15:01:27.982633: E external/xla/cuda_dnn.cc:9261] Unable to register cuDNN\n",
      "2026-11-24 15:01:28.031213: W tensorflow/py_utils.cc:38] TF-TRT Warning: no TensorRT\n",
      "F1124 15:01:29.000001   2176 status.cc:10] Check failed: a fatal one\n",
      "Traceback (most recent call last):\n",
      "  File \"x.py\", line 1, in <module>\n",
      "ImportError: a real failure\n",
  ])
  assert tf_startup.filter_startup_lines(captured) == "".join([
      "/x/numpy/core.py:12: UserWarning: a warning of the program's own\n",
      "  warnings.warn('a warning')\n",
      "F1124 15:01:29.000001   2176 status.cc:10] Check failed: a fatal one\n",
      "Traceback (most recent call last):\n",
      "  File \"x.py\", line 1, in <module>\n",
      "ImportError: a real failure\n",
  ])


def test_the_filter_keeps_text_with_no_record_unchanged():
  text = "plain text\nwith two lines and no newline at the end"
  assert tf_startup.filter_startup_lines(text) == text
  assert tf_startup.filter_startup_lines("") == ""


# --- the programs ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["train.py", "--helpshort"],
    ["export.py", "--helpshort"],
    ["preprocess.py", "--helpshort"],
    ["-m", "serving.predict", "--help"],
    ["-m", "serving.client", "--help"],
], ids=lambda argv: " ".join(argv[:2]))
def test_entry_points_print_no_start_up_line(argv):
  done = _run([sys.executable, *argv])
  assert done.returncode in (0, 1), done.stderr[-3000:]  # absl's --helpshort exits 1
  assert "--" in done.stdout + done.stderr  # the help itself
  assert _startup_lines(done.stdout + done.stderr) == []


LATER = """
import sys
from estimator_tpu.compat import tf
tf.constant(1.0)
tf.compat.v2.profiler.experimental.client.trace  # loads the profiler's native module now
# A C++ log record after start-up (the Print op logs its message at INFO).
with tf.Session() as session:
  session.run(tf.raw_ops.Print(input=tf.constant(1), data=[tf.constant(7)],
                               message="later-record "))
print("done", file=sys.stderr)
"""


def test_first_use_of_compat_tf_is_quiet_and_later_cpp_records_still_print():
  done = _run([sys.executable, "-c", LATER], TF_CPP_MIN_LOG_LEVEL="0")
  assert done.returncode == 0, done.stderr[-3000:]
  assert _startup_lines(done.stderr) == []
  assert "later-record [7]" in done.stderr  # TF_CPP_MIN_LOG_LEVEL=0 asked for INFO
  assert done.stderr.rstrip().endswith("done")


RECORDS = """
import os, sys
from estimator_tpu.compat import tf
path = os.path.join(sys.argv[1], "x.tfrecord")
with tf.python_io.TFRecordWriter(path) as writer:
  writer.write(b"x")
record = tf.data.TFRecordDataset(path).make_one_shot_iterator().get_next()
with tf.Session() as session:
  print(session.run(record), os.environ["TF_CPP_MIN_LOG_LEVEL"])
"""
# What TF 2.21 logs at INFO for that program; TF 1.15 printed neither.
LATER_INFO = ("MLIR V1 optimization pass is not enabled", "TFRecordDataset `buffer_size`")


def test_the_compat_import_keeps_later_cpp_info_lines_away_unless_asked_for(tmp_path):
  done = _run([sys.executable, "-c", RECORDS, str(tmp_path)])  # no TF_CPP_MIN_LOG_LEVEL
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split() == ["b'x'", "1"]  # INFO off; warnings and errors still print
  assert not [line for line in done.stderr.splitlines()
              if any(mark in line for mark in LATER_INFO)], done.stderr
  asked = _run([sys.executable, "-c", RECORDS, str(tmp_path)], TF_CPP_MIN_LOG_LEVEL="0")
  assert asked.stdout.split() == ["b'x'", "0"]  # the user's level wins
  if stacks.NAME == "current":
    assert all(mark in asked.stderr for mark in LATER_INFO)


def test_the_switch_shows_start_up_lines_again():
  done = _run([sys.executable, "-c", "import estimator_tpu, tensorflow"],
              TF_CPP_MIN_LOG_LEVEL="0", **{tf_startup.SHOW_ENV: "1"})
  assert done.returncode == 0, done.stderr[-3000:]
  assert "oneDNN custom operations are on" in done.stderr  # what the hook keeps away


# --- one line per log record -----------------------------------------------------------------

TF1_PROGRAM = """
import sys
from estimator_tpu.compat import tf

def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(features["x"], 2)
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  optimizer = tf.contrib.tpu.CrossShardOptimizer(tf.train.GradientDescentOptimizer(0.1))
  train_op = optimizer.minimize(loss, tf.train.get_global_step())
  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn(params):
  x = tf.random.uniform([params["batch_size"], 3])
  dataset = tf.data.Dataset.from_tensors(({"x": x}, tf.zeros([params["batch_size"]], tf.int32)))
  return dataset.repeat()

def main(unused_argv):
  tf.logging.set_verbosity(tf.logging.INFO)
  tf.logging.info("program record")
  config = tf.contrib.tpu.RunConfig(model_dir=sys.argv[1], save_checkpoints_steps=2)
  estimator = tf.contrib.tpu.TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                                          train_batch_size=4)
  estimator.train(input_fn, max_steps=2)

if sys.argv[2] == "app":
  tf.app.run(main, argv=sys.argv[:1])
else:
  main(None)
"""


@pytest.mark.parametrize("launch", ["app", "plain"])
def test_a_tf1_program_prints_each_tensorflow_record_once(tmp_path, launch):
  done = _run([sys.executable, "-c", TF1_PROGRAM, str(tmp_path / "model"), launch])
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stderr.splitlines()
  assert _startup_lines(done.stderr) == []
  # TF 1.15's format, once each: the program's own record, the estimator's, compat's note.
  assert lines.count("INFO:tensorflow:program record") == 1
  assert lines.count("INFO:tensorflow:Calling model_fn.") == 1
  assert len([line for line in lines if line.startswith(
      "INFO:tensorflow:tf.contrib.tpu.CrossShardOptimizer is used outside")]) == 1
  assert len([line for line in lines if "Saving checkpoints for 2 into" in line]) == 1
  # No second copy in another format (absl's "I1123 ... file.py:115] message").
  assert [line for line in lines if line.endswith("] Calling model_fn.")] == []
  records = [line for line in lines if line.startswith(("INFO:tensorflow:", "WARNING:tensorflow:"))]
  repeated = [a for a, b in zip(records, records[1:]) if a == b]
  assert repeated == []
