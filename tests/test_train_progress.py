"""Training's progress line: the hook asks for the step and loss the TF 1 way, on any engine."""

import io
import re

import pytest
import tensorflow as tf

from estimator_tpu import progress
from estimator_tpu.run import train_progress

LINE = re.compile(r"step (\d+)/10 \| loss (\d+\.\d{4})( \| \d+ img/s)?( \| \w+ left)?")


@pytest.fixture
def every_line(monkeypatch):
  monkeypatch.setenv(progress.ENV, "1e-9")  # a plain line at each update


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_on_a_terminal_a_live_line_redrawn_in_place_then_taken_off(monkeypatch):
  monkeypatch.setenv(progress.ENV, "60")
  terminal, said = _Terminal(), []
  shown = progress.Progress(5, "steps", None, stream=terminal, say=said.append)
  for step in range(1, 6):
    shown.update(step, f"loss {step / 10:.4f}")
    shown._bar.refresh()  # noqa: SLF001 - tqdm draws at most every 0.5 s: draw each step here
  shown.close()
  drawn = [part for part in terminal.getvalue().split("\r") if part.strip()]
  assert said == []  # no plain lines on a terminal
  assert re.fullmatch(r"5/5 steps \|#{24}\| loss 0\.5000 \[\d\d:\d\d<\d\d:\d\d\]", drawn[-1]), drawn
  assert terminal.getvalue().endswith("\r")  # the line is cleared at the end


def _graph_with_step_and_loss(steps_per_run=1):
  """A TF 1 training graph as the Estimator leaves it: a global step, the loss in LOSSES.

  The loss is the step before the run, times 0.5, plus 1; a run takes steps_per_run steps.
  """
  step = tf.compat.v1.train.get_or_create_global_step()
  loss = tf.cast(step.read_value(), tf.float32) * 0.5 + 1.0
  tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, loss)
  with tf.control_dependencies([loss]):
    return tf.compat.v1.assign_add(step, steps_per_run)


@pytest.mark.parametrize("steps_per_run", [1, 3])
def test_a_line_per_session_run_with_the_step_after_it_and_its_loss(every_line, steps_per_run):
  said = []
  shown = train_progress.TrainProgress(10, batch_size=8, start_step=0, say=said.append)
  with tf.Graph().as_default():
    train_op = _graph_with_step_and_loss(steps_per_run)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[shown.hook()]) as session:
      for _ in range(3):
        session.run(train_op)
  shown.close()
  seen = [LINE.fullmatch(line) for line in said]
  assert all(seen), said
  ends = [steps_per_run * run for run in (1, 2, 3)]
  assert [int(m.group(1)) for m in seen] == ends
  assert [float(m.group(2)) for m in seen] == [(end - steps_per_run) * 0.5 + 1 for end in ends]


def test_steps_run_without_a_fetch_until_a_line_is_due(monkeypatch):
  monkeypatch.setenv(progress.ENV, "3600")
  said = []
  shown = train_progress.TrainProgress(10, batch_size=8, start_step=0, say=said.append)
  hook = shown.hook()
  with tf.Graph().as_default():
    _graph_with_step_and_loss()
    hook.begin()
  context = tf.compat.v1.train.SessionRunContext(
      tf.compat.v1.train.SessionRunArgs(fetches=None), session=None)
  assert hook.before_run(context) is None  # the first plain line is an hour away
  monkeypatch.setattr(progress.time, "monotonic", lambda: float("inf"))
  assert sorted(hook.before_run(context).fetches) == ["loss", "step"]
  shown.close()


def test_an_engine_without_a_session_serves_the_fetches_per_step(every_line):
  """How an engine with no session runs it: before_run's fetches, served with its own values."""
  said = []
  shown = train_progress.TrainProgress(10, batch_size=8, start_step=4, say=said.append)
  hook = shown.hook()
  with tf.Graph().as_default():
    _graph_with_step_and_loss()
    hook.begin()
  for step in (5, 6, 7):
    context = tf.compat.v1.train.SessionRunContext(
        tf.compat.v1.train.SessionRunArgs(fetches=None), session=None)
    asked = hook.before_run(context)
    assert sorted(asked.fetches) == ["loss", "step"]
    values = {"step": step, "loss": step / 10}
    hook.after_run(context, tf.compat.v1.train.SessionRunValues(
        results={key: values[key] for key in asked.fetches}, options=None, run_metadata=None))
  shown.close()
  assert [LINE.fullmatch(line).group(1, 2) for line in said] == [
      ("5", "0.5000"), ("6", "0.6000"), ("7", "0.7000")]


def test_no_global_step_no_fetch_and_results_none_change_nothing(every_line):
  said = []
  shown = train_progress.TrainProgress(10, batch_size=8, start_step=0, say=said.append)
  hook = shown.hook()
  with tf.Graph().as_default():
    hook.begin()  # a graph without a global step
  context = tf.compat.v1.train.SessionRunContext(
      tf.compat.v1.train.SessionRunArgs(fetches=None), session=None)
  assert hook.before_run(context) is None
  hook.after_run(context, tf.compat.v1.train.SessionRunValues(
      results=None, options=None, run_metadata=None))
  assert said == []
  shown.update(3)  # the loop, after a train() call
  assert said and said[-1].startswith("step 3/10")
  shown.close()


def test_train_py_shows_each_steps_line_between_evaluations(every_line, tmp_path, digits_dir,
                                                            capsys):
  from absl import flags
  from conftest import IMAGE_SIZE

  from estimator_tpu import flags as flags_lib
  from estimator_tpu.cli import train
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", f"--data_dir={digits_dir}", f"--model_dir={tmp_path}", "--model=tiny",
               f"--image_size={IMAGE_SIZE}", "--train_batch_size=8", "--eval_batch_size=8",
               "--train_steps=4", "--steps_per_eval=4", "--norandom_flip", "--seed=1"])
  assert train.run(flag_values) == 0
  lines = capsys.readouterr().out.splitlines()
  shown = [re.fullmatch(r"\[estimator_tpu\] step (\d)/4 \| loss \d+\.\d{4}.*", line)
           for line in lines]
  steps = [int(m.group(1)) for m in shown if m]
  assert steps == [1, 2, 3, 4], lines
  evaluated = next(i for i, line in enumerate(lines) if "step 4/4 | accuracy=" in line)
  assert max(i for i, m in enumerate(shown) if m) < evaluated  # all before the evaluation
