"""summary_writers: TF 2 writers made while the distribute engine traces, as TF 1 had them."""

import glob
import os

import pytest
import tensorflow as tf

from estimator_tpu.engines.distribute import summary_writers
from estimator_tpu.engines.distribute import workers as workers_lib


def _writers(chief=True):
  workers = workers_lib.Workers(tf.distribute.OneDeviceStrategy("/cpu:0"))
  workers.is_chief = chief
  return summary_writers.TracedWriters(workers), workers


def _step(writers, logdir):
  """A traced step whose model code makes a writer and writes `x` at step `step` through it."""

  def step(x, step):
    with writers.replica(0):
      writer = tf.summary.create_file_writer(logdir)
      with tf.control_dependencies([writer.init()]), writer.as_default():
        return tf.summary.scalar("x", x, step=step)

  def traced(x, step_):
    with writers.tracing("step"):
      return step(x, step_)
  return tf.function(traced, autograph=False)


def _steps_by_file(logdir):
  return [sorted(e.step for e in tf.compat.v1.train.summary_iterator(p) if e.summary.value)
          for p in sorted(glob.glob(os.path.join(logdir, "events.*.v2")))]


def test_a_traced_writer_makes_one_file_per_call_when_its_function_runs(tmp_path):
  writers, _ = _writers()
  logdir = str(tmp_path / "summaries")
  function = _step(writers, logdir)
  with writers.call():
    function.get_concrete_function(tf.constant(1.0), tf.constant(0, tf.int64))
    assert not os.path.exists(logdir)  # traced, not run: no file
    writers.ready("step")
    for step in range(3):
      assert function(tf.constant(1.0), tf.constant(step, tf.int64))
  assert _steps_by_file(logdir) == [[0, 1, 2]]  # flushed as the call ended
  with writers.call():  # the next call (a new session in TF 1) writes a file of its own
    writers.ready("step")
    function(tf.constant(2.0), tf.constant(3, tf.int64))
  assert _steps_by_file(logdir) == [[0, 1, 2], [3]]


def test_init_inside_a_trace_is_an_op_and_left_alone_outside(tmp_path):
  writers, _ = _writers()
  with writers.tracing("step"):
    eager = tf.summary.create_file_writer(str(tmp_path))
    assert eager.init() is None  # eagerly, as TensorFlow gives it
  with tf.Graph().as_default(), writers.tracing("step"):
    writer = tf.summary.create_file_writer(str(tmp_path))
    assert isinstance(writer.init(), tf.Operation)  # made in the graph: its own init op
  assert tf.summary.create_file_writer(str(tmp_path)).init() is None


@pytest.mark.parametrize("chief,replica", [(False, 0), (True, 1)])
def test_other_workers_and_replicas_write_aside(tmp_path, chief, replica):
  writers, workers = _writers(chief)
  logdir = str(tmp_path / "summaries")

  def traced(x):
    with writers.tracing("step"), writers.replica(replica):
      writer = tf.summary.create_file_writer(logdir)
      with writer.as_default():
        return tf.summary.scalar("x", x, step=0)

  function = tf.function(traced, autograph=False)
  with writers.call():
    function.get_concrete_function(tf.constant(1.0))
    writers.ready("step")
    function(tf.constant(1.0))
  assert not os.path.exists(logdir)
  assert len(glob.glob(os.path.join(workers._scratch, "summaries_*", "events.*.v2"))) == 1
