"""TF 1 scripts' top-level graph code under the compat `tf`: graph mode, as TF 1 ran."""

import glob
import os
import sys

from conftest import program_env
import programs
import pytest
import tensorflow as tf

from estimator_tpu.compat import activation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys
from estimator_tpu.compat import tf

x = tf.placeholder(tf.float32, [None, 3], name="x")
w = tf.get_variable("w", [3, 1], initializer=tf.ones_initializer())
y = tf.matmul(x, w)
tf.summary.scalar("first", y[0, 0])
merged = tf.summary.merge_all()
writer = tf.summary.FileWriter(sys.argv[1], tf.get_default_graph())
saver = tf.train.Saver()
with tf.Session() as sess:
  sess.run(tf.global_variables_initializer())
  out, summary = sess.run([y, merged], feed_dict={x: [[1.0, 2.0, 3.0]]})
  writer.add_summary(summary, 7)
  writer.add_summary(tf.Summary(value=[tf.Summary.Value(tag="AP", simple_value=0.5)]), 7)
  writer.close()
  saver.save(sess, sys.argv[1] + "/model.ckpt")
print(tf.executing_eagerly(), out.tolist())
"""


def _run(logdir, **env):
  return programs.run([sys.executable, "-c", SCRIPT, str(logdir)], cwd=REPO,
                        capture_output=True, text=True, timeout=120,
                        env=program_env(TF_CPP_MIN_LOG_LEVEL="3", **env))


def test_top_level_placeholders_sessions_and_file_writer_run_as_in_tf_1(tmp_path):
  done = _run(tmp_path)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split("\n")[-2] == "False [[6.0]]"
  (events,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  values = {(value.tag, event.step): value.simple_value
            for event in tf.compat.v1.train.summary_iterator(events)
            for value in event.summary.value}
  assert values == {("first", 7): 6.0, ("AP", 7): 0.5}
  assert tf.train.load_variable(str(tmp_path / "model.ckpt"), "w").tolist() == [[1], [1], [1]]


def test_eager_execution_can_be_kept_on_and_a_bad_mode_is_named(tmp_path):
  done = _run(tmp_path, **{activation.EXECUTION_ENV: "eager"})
  assert done.returncode != 0
  assert "tf.placeholder() is not compatible with eager execution" in done.stderr
  done = _run(tmp_path, **{activation.EXECUTION_ENV: "tf1"})
  assert done.returncode != 0
  assert ("ESTIMATOR_TPU_COMPAT_EXECUTION='tf1' is not an execution mode: use graph"
          in done.stderr)


@pytest.mark.parametrize("mode,expected", [("graph", "graph mode"),
                                           ("eager", "eager execution on")])
def test_the_activation_line_says_which_mode(tmp_path, mode, expected):
  code = ("import logging\n"
          "logging.getLogger('tensorflow').setLevel(logging.INFO)\n"
          "from estimator_tpu.compat import tf\n"
          "print(tf.executing_eagerly())\n")
  done = programs.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                        text=True, timeout=120,
                        env=program_env(TF_CPP_MIN_LOG_LEVEL="3",
                                        **{activation.EXECUTION_ENV: mode}))
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip() == str(mode == "eager")
  assert f"with tf.contrib, {expected}, TF 1 shapes on" in done.stderr
