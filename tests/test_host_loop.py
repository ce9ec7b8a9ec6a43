"""host_loop: off TPU, iterations_per_loop training steps per session.run, with exact steps,
checkpoints and summaries."""

import glob
import os

from conftest import IMAGE_SIZE
from conftest import fixed_input_fn
from conftest import tiny_config
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.engines import host_loop
from estimator_tpu.model import model_fn as model_fn_lib


class StepsPerRunHook(tf.compat.v1.train.SessionRunHook):
  """Records the global step after every session.run."""

  def __init__(self):
    self.steps = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def after_run(self, run_context, run_values):
    del run_values
    self.steps.append(int(run_context.session.run(self._global_step)))


def _input_fn(digits_dir):
  return input_pipeline.make_input_fn(os.path.join(digits_dir, "train-*"), True, IMAGE_SIZE,
                                      random_flip=False, seed=1)


def _estimator(model_dir, iterations_per_loop, model_fn=model_fn_lib.model_fn, host_loop=True,
               **train):
  config = tiny_config(model_dir, **train).replace(
      "runtime", iterations_per_loop=iterations_per_loop, host_loop=host_loop).validate()
  stacks.keras.utils.set_random_seed(1)  # the same initial weights on every call
  return estimator_lib.build_estimator(config, model_fn=model_fn)


def _train(estimator, digits_dir, input_fn=None, **steps):
  hook = StepsPerRunHook()
  estimator.train(input_fn or _input_fn(digits_dir), hooks=[hook], **steps)
  return hook.steps


def _host_call_steps(model_dir):
  """{tag: sorted steps} of the host_call's event files."""
  steps = {}
  for path in glob.glob(os.path.join(str(model_dir), "events.*.v2")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        steps.setdefault(value.tag, []).append(event.step)
  return {tag: sorted(s) for tag, s in steps.items()}


def _checkpoint_steps(model_dir):
  return sorted(int(path.rsplit("-", 1)[1].split(".")[0])
                for path in glob.glob(os.path.join(str(model_dir), "model.ckpt-*.index")))


def test_each_run_trains_a_loop_and_the_last_loop_ends_on_the_last_step(tmp_path, digits_dir):
  estimator = _estimator(tmp_path, 3, train_steps=9, steps_per_eval=9, summary_every_n_steps=1)
  assert estimator.host_loop_iterations == 3
  assert host_loop.steps_per_run(estimator) == 3
  assert _train(estimator, digits_dir, steps=7) == [3, 6, 7]
  assert _train(estimator, digits_dir, max_steps=9) == [9]
  assert _checkpoint_steps(tmp_path) == [0, 7, 9]
  # The host_call ran inside the loop: a summary for every step it started from.
  summaries = _host_call_steps(tmp_path)
  assert sorted(summaries) == ["train/accuracy", "train/examples_per_sec",
                               "train/learning_rate", "train/loss"]
  assert all(steps == list(range(9)) for steps in summaries.values()), summaries


def test_summaries_every_n_steps_are_the_same_steps_inside_the_loop(tmp_path, digits_dir):
  estimator = _estimator(tmp_path, 4, train_steps=10, summary_every_n_steps=3)
  assert _train(estimator, digits_dir, steps=10) == [4, 8, 10]
  assert set(map(tuple, _host_call_steps(tmp_path).values())) == {(0, 3, 6, 9)}


def test_checkpoints_are_saved_between_loops(tmp_path, digits_dir):
  estimator = _estimator(tmp_path, 2, train_steps=8, save_checkpoints_steps=4)
  assert _train(estimator, digits_dir, steps=8) == [2, 4, 6, 8]
  assert _checkpoint_steps(tmp_path) == [0, 4, 8]


def test_the_loop_trains_the_weights_one_step_per_run_does(tmp_path, digits_dir):
  weights = {}
  for iterations in (1, 4):
    model_dir = tmp_path / f"loop{iterations}"
    estimator = _estimator(model_dir, iterations, train_steps=4)
    assert estimator.host_loop_iterations == iterations
    assert len(_train(estimator, digits_dir, fixed_input_fn, steps=4)) == 4 // iterations
    weights[iterations] = {name: estimator.get_variable_value(name)
                           for name in estimator.get_variable_names()
                           if "Momentum" not in name and "iterations_per_loop" not in name}
  assert weights[1]["global_step"] == weights[4]["global_step"] == 4
  assert sorted(weights[1]) == sorted(weights[4])
  for name, value in weights[1].items():
    np.testing.assert_allclose(weights[4][name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_one_iteration_per_loop_and_evaluation_run_the_model_fn_as_it_is(tmp_path, digits_dir):
  estimator = _estimator(tmp_path, 1, train_steps=2)
  assert host_loop.steps_per_run(estimator) == 1
  assert _train(estimator, digits_dir, steps=2) == [1, 2]
  eval_fn = input_pipeline.make_input_fn(os.path.join(digits_dir, "validation-*"), False,
                                         IMAGE_SIZE, num_examples=37, global_batch_size=8)
  estimator = _estimator(tmp_path, 3, train_steps=2)
  results = estimator.evaluate(eval_fn, steps=5)
  assert results["global_step"] == 2 and results["num_eval_examples"] == 37


def test_without_the_flag_each_run_is_one_step(tmp_path, digits_dir):
  estimator = _estimator(tmp_path, 3, host_loop=False, train_steps=4)
  assert host_loop.steps_per_run(estimator) == 1
  assert _train(estimator, digits_dir, steps=4) == [1, 2, 3, 4]


def test_no_loop_on_a_tpu(tmp_path):
  config = tiny_config(tmp_path).replace("runtime", use_tpu=True, iterations_per_loop=5)
  run_config = estimator_lib.build_run_config(config, resolver_fn=lambda runtime: None)
  assert host_loop.loop_iterations(run_config, use_tpu=True) == 1
  assert host_loop.loop_iterations(run_config, use_tpu=False) == 5


def test_v1_summaries_in_the_loop_are_refused_with_the_fix(tmp_path, digits_dir):
  def model_fn(features, labels, mode, params):
    spec = model_fn_lib.model_fn(features, labels, mode, params)
    tf.compat.v1.summary.scalar("my_loss", spec.loss)
    return spec

  estimator = _estimator(tmp_path, 2, model_fn=model_fn)
  with pytest.raises(ValueError, match="tf.compat.v1.summary.*leave out --host_loop"):
    estimator.train(_input_fn(digits_dir), steps=2)


def test_a_writer_made_inside_the_loop_is_refused_with_the_fix(tmp_path, digits_dir):
  from tensorflow.python.ops import summary_ops_v2

  def host_call_fn(step):
    with summary_ops_v2.create_file_writer(str(tmp_path)).as_default():  # TF 1.15's own
      return [summary_ops_v2.scalar("step", 1.0, step=step[0])]

  def model_fn(features, labels, mode, params):
    spec = model_fn_lib.model_fn(features, labels, mode, params)
    step = tf.reshape(tf.compat.v1.train.get_global_step(), [1])
    return spec._replace(host_call=(host_call_fn, [step]))

  estimator = _estimator(tmp_path, 2, model_fn=model_fn)
  with pytest.raises(ValueError, match="summary writer inside the loop.*create_file_writer"):
    estimator.train(_input_fn(digits_dir), steps=2)
