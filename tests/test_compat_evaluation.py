"""tf.contrib.training's eval loop, against checkpoints written while the test runs."""

import glob
import os
import time

import numpy as np
import pytest
import tensorflow as real_tf

from estimator_tpu.compat import tf

v1 = real_tf.compat.v1


class CheckpointWriter:
  """Writes checkpoints of a graph with the global step and w, on demand."""

  def __init__(self, directory):
    self.directory = directory
    self.graph = v1.Graph()
    with self.graph.as_default():
      self.step = v1.train.get_or_create_global_step()
      self.w = v1.get_variable("w", initializer=0.0)
      self.value = v1.placeholder(v1.float32, [])
      self.assign = v1.group(self.step.assign_add(1), self.w.assign(self.value))
      self.saver = v1.train.Saver(max_to_keep=None)
      self.session = v1.Session()
      self.session.run(v1.global_variables_initializer())

  def write(self, w):
    """Saves one more step with w; returns the checkpoint path."""
    with self.graph.as_default():
      self.session.run(self.assign, {self.value: w})
      step = self.session.run(self.step)
      return self.saver.save(self.session, os.path.join(self.directory, "model.ckpt"), step)


@pytest.fixture
def writer(tmp_path):
  writer = CheckpointWriter(str(tmp_path))
  yield writer
  writer.session.close()


def test_wait_for_new_checkpoint_times_out_with_none(writer):
  start = time.time()
  found = tf.contrib.training.wait_for_new_checkpoint(writer.directory, seconds_to_sleep=0.2,
                                                      timeout=1.0)
  # TF 1.15: it gives up when one more sleep would pass the timeout.
  assert found is None and 0.8 <= time.time() - start < 3.0


def test_wait_for_new_checkpoint_returns_only_a_newer_one(writer):
  first = writer.write(1.0)
  assert tf.contrib.training.wait_for_new_checkpoint(writer.directory, timeout=1) == first
  assert tf.contrib.training.wait_for_new_checkpoint(
      writer.directory, last_checkpoint=first, seconds_to_sleep=0.2, timeout=0.6) is None
  second = writer.write(2.0)
  assert tf.contrib.training.wait_for_new_checkpoint(
      writer.directory, last_checkpoint=first, timeout=1) == second


def test_checkpoints_iterator_timeout_fn_and_min_interval(writer):
  writer.write(1.0)
  calls, yielded, times = [], [], []

  def timeout_fn():
    # TF 1.15: asked after each checkpoint and on each timeout; True ends the loop.
    calls.append(time.time())
    return len(calls) == 4  # after checkpoints 1, 2, 3, then the timeout

  for path in tf.contrib.training.checkpoints_iterator(
      writer.directory, min_interval_secs=1.0, timeout=1.5, timeout_fn=timeout_fn):
    yielded.append(int(path.rsplit("-", 1)[1]))
    times.append(time.time())
    if len(yielded) < 3:
      writer.write(float(len(yielded) + 1))  # written while the loop runs
  assert yielded == [1, 2, 3] and len(calls) == 4
  # Never two checkpoints within min_interval_secs; the end only after waiting for a
  # fourth (polling each second, it stops when the next poll would pass the timeout).
  assert all(b - a >= 1.0 for a, b in zip(times, times[1:]))
  assert calls[-1] - calls[-2] >= 0.5


def _eval_graph(eval_steps):
  """w's checkpointed value averaged over eval_steps runs, and the eval step count."""
  graph = v1.Graph()
  with graph.as_default():
    v1.train.get_or_create_global_step()
    w = v1.get_variable("w", initializer=0.0)
    mean, update = v1.metrics.mean(w)
    v1.summary.scalar("w_mean", mean)
    hook = tf.contrib.training.StopAfterNEvalsHook(eval_steps)
  return graph, mean, update, hook


def test_evaluate_repeatedly_restores_each_new_checkpoint(writer, tmp_path):
  writer.write(3.0)
  graph, mean, update, stop_hook = _eval_graph(eval_steps=3)
  with graph.as_default():
    eval_step = tf.contrib.training.get_or_create_eval_step()
    log_dir = str(tmp_path / "eval")
    asked = []  # timeout_fn: after the evaluation (go on), then after the timeout (stop)
    start = time.time()
    final = tf.contrib.training.evaluate_repeatedly(
        writer.directory, eval_ops=update, final_ops={"mean": mean, "eval_step": eval_step},
        hooks=[stop_hook, tf.contrib.training.SummaryAtEndHook(log_dir)],
        eval_interval_secs=0, timeout=1.5, timeout_fn=lambda: len(asked.append(1) or asked) == 2)
  assert final == {"mean": 3.0, "eval_step": 3}
  assert len(asked) == 2
  assert time.time() - start >= 1.0  # it polled for another checkpoint until the timeout
  (events,) = glob.glob(os.path.join(log_dir, "events.*"))
  written = [(event.step, value.tag, value.simple_value)
             for event in v1.train.summary_iterator(events) for value in event.summary.value]
  assert written == [(1, "w_mean", 3.0)]


def test_evaluate_repeatedly_stops_after_max_number_of_evaluations(writer):
  writer.write(5.0)
  graph, mean, update, stop_hook = _eval_graph(eval_steps=2)
  with graph.as_default():
    final = tf.contrib.training.evaluate_repeatedly(
        writer.directory, eval_ops=[update], final_ops=mean, hooks=[stop_hook],
        eval_interval_secs=0, max_number_of_evaluations=1)
  np.testing.assert_allclose(final, 5.0)


def test_evaluate_once_is_the_one_checkpoint_form(writer):
  path = writer.write(7.0)
  graph, mean, update, stop_hook = _eval_graph(eval_steps=2)
  with graph.as_default():
    final = tf.contrib.training.evaluate_once(path, eval_ops=update, final_ops=mean,
                                              hooks=[stop_hook])
  assert final == 7.0


def test_summary_at_end_hook_needs_somewhere_to_write():
  with pytest.raises(ValueError, match="log_dir or summary_writer"):
    tf.contrib.training.SummaryAtEndHook()
