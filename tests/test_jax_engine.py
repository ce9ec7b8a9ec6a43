"""--engine=jax: each step lowered by TensorFlow's XLA bridge and run by JAX, step for step.

The engine and the estimator start from the same checkpoint and read the same
fixed batches, so their per-step losses, evaluations and checkpoints compare
directly. Runs on two JAX devices are a program of their own (JAX's CPU device
count is set before its backend starts): run as a script, this file is that child.
"""

import glob
import json
import os
import shutil
import sys

import numpy as np
import programs
import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS_DIR)  # as a child script too

import contract_programs  # noqa: E402

if not contract_programs.HAS_JAX:
  pytest.skip(contract_programs.NO_JAX, allow_module_level=True)

from conftest import IMAGE_SIZE  # noqa: E402
from conftest import NUM_EVAL  # noqa: E402
from conftest import fixed_input_fn  # noqa: E402
from conftest import program_env  # noqa: E402
from conftest import summary_scalars  # noqa: E402
from conftest import tiny_config  # noqa: E402
import jax  # noqa: E402
import tensorflow as tf  # noqa: E402

from estimator_tpu import stacks  # noqa: E402
from estimator_tpu.data import input_pipeline  # noqa: E402
from estimator_tpu.engines import choose  # noqa: E402
from estimator_tpu.engines.jax import collectives  # noqa: E402
from estimator_tpu.engines.jax import lowering  # noqa: E402
from estimator_tpu.model import model_fn as model_fn_lib  # noqa: E402

REPO_DIR = os.path.dirname(TESTS_DIR)
BATCH = 16
START = 2  # both engines go on from the checkpoint of this step
STEPS = START + 20
CHILD_TIMEOUT_SECS = 300


def _eval_input_fn(digits_dir, batch=BATCH):
  return input_pipeline.make_input_fn(
      os.path.join(digits_dir, "validation-*"), False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=batch)


def _config(model_dir, engine, strategy="none", eval_batch=BATCH, **runtime):
  return tiny_config(model_dir, train_steps=STEPS, steps_per_eval=STEPS, train_batch_size=BATCH,
                     eval_batch_size=eval_batch, base_learning_rate=0.5,
                     lr_schedule="constant", save_checkpoints_steps=10).replace(
      "runtime", engine=engine, strategy=strategy, iterations_per_loop=3, **runtime).validate()


def _build(model_dir, engine, model_fn=model_fn_lib.model_fn, **settings):
  config = _config(model_dir, engine, **settings)
  stacks.keras.utils.set_random_seed(1)  # the same initial weights on every call
  return choose.build_estimator(config, config.data.class_names, model_fn=model_fn)


def _variables(model_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory):
  """The estimator trains START steps; then it and the JAX engine each train on from there."""
  root = tmp_path_factory.mktemp("engines")
  start = str(root / "start")
  _build(start, "estimator").train(fixed_input_fn, max_steps=START)
  dirs = {}
  for engine in ("estimator", "jax"):
    dirs[engine] = str(root / engine)
    shutil.copytree(start, dirs[engine])
    _build(dirs[engine], engine, strategy="one_device").train(fixed_input_fn, max_steps=STEPS)
  return dirs


def test_twenty_steps_from_a_shared_checkpoint_match_the_estimators_losses(two_engines):
  estimator = summary_scalars(two_engines["estimator"], "train/loss")
  engine = summary_scalars(two_engines["jax"], "train/loss")
  assert sorted(engine) == sorted(estimator) == list(range(STEPS))
  for step in range(START, STEPS):
    assert engine[step] == pytest.approx(estimator[step], abs=1e-4), step
  assert estimator[STEPS - 1] < estimator[START] - 0.1  # it trains


def test_the_checkpoints_hold_the_estimators_names_values_and_steps(two_engines):
  estimator = _variables(two_engines["estimator"])
  engine = _variables(two_engines["jax"])
  assert sorted(engine) == sorted(estimator)
  assert int(engine["global_step"]) == STEPS
  assert engine["global_step"].dtype == np.int64
  assert any(name.endswith("/Momentum") for name in engine)  # the optimizer's slots too
  for name, value in estimator.items():
    np.testing.assert_allclose(engine[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
  steps = {engine: sorted(int(p.rsplit("-", 1)[1][:-len(".index")]) for p in glob.glob(
      os.path.join(model_dir, "model.ckpt-*.index"))) for engine, model_dir in two_engines.items()}
  # Every save_checkpoints_steps from where the run began, as the estimator's saver hook saves.
  assert steps["jax"] == steps["estimator"] == [0, START, START + 10, STEPS]


def test_evaluation_is_the_estimators_on_the_same_checkpoint(two_engines, digits_dir):
  model_dir = two_engines["jax"]
  steps = input_pipeline.eval_steps(NUM_EVAL, BATCH)
  by_estimator = _build(model_dir, "estimator").evaluate(_eval_input_fn(digits_dir), steps=steps)
  by_engine = _build(model_dir, "jax", strategy="one_device").evaluate(
      _eval_input_fn(digits_dir), steps=steps)
  assert by_engine["num_eval_examples"] == by_estimator["num_eval_examples"] == NUM_EVAL
  assert by_engine["global_step"] == STEPS
  for name in ("accuracy", "top_5_accuracy", "eval_loss", "mean_per_class_accuracy", "macro_f1",
               "loss"):
    assert by_engine[name] == pytest.approx(by_estimator[name], abs=1e-5), name


def test_predictions_carry_the_class_names_the_host_looks_up(two_engines):
  built = _build(two_engines["jax"], "jax", strategy="one_device")

  def input_fn(params):
    return fixed_input_fn(params).take(2)

  predictions = list(built.predict(input_fn))
  reference = list(_build(two_engines["jax"], "estimator").predict(input_fn))
  assert len(predictions) == len(reference) == 2 * BATCH
  for got, want in zip(predictions, reference):
    assert got["classid"] == want["classid"]
    assert got["class"] == want["class"] == str(want["classid"]).encode()
    np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)


def test_the_estimator_resumes_and_exports_a_jax_model_dir(two_engines, tmp_path):
  from estimator_tpu.export import saved_model
  model_dir = str(tmp_path / "resumed")
  shutil.copytree(two_engines["jax"], model_dir)
  _build(model_dir, "estimator").train(fixed_input_fn, max_steps=STEPS + 2)
  assert int(_variables(model_dir)["global_step"]) == STEPS + 2
  images = np.random.default_rng(3).uniform(-1, 1, (5, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(
      np.float32)
  built = _build(two_engines["jax"], "jax", strategy="one_device")
  path = saved_model.export_saved_model(built, str(tmp_path / "export"))
  outputs = tf.saved_model.load(path).signatures["predict_images"](images=tf.constant(images))
  expected = [int(p["classid"]) for p in _build(two_engines["jax"], "estimator").predict(
      lambda params: tf.data.Dataset.from_tensor_slices({"image": images}).batch(5))]
  assert outputs["classid"].numpy().tolist() == expected


def test_the_engine_names_itself_and_its_devices(tmp_path):
  built = _build(str(tmp_path), "jax", strategy="one_device")
  config = _config(str(tmp_path), "jax", strategy="one_device")
  assert choose.describe_engine(built, config.runtime) == "jax (1 cpu device)"


# What the XLA bridge cannot lower is refused in one line.

def _model_fn_with(extra):
  def model_fn(features, labels, mode, params):
    flat = tf.reshape(features["image"], [params["batch_size"], -1])
    logits = tf.compat.v1.layers.dense(extra(flat), 10)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step())
    return stacks.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
  return model_fn


def test_a_py_func_in_the_step_is_refused_naming_the_op(tmp_path):
  def tanh_on_the_host(x):
    y = tf.compat.v1.py_func(np.tanh, [x], tf.float32, stateful=False)
    y.set_shape(x.shape)
    return y

  py_func = _model_fn_with(tanh_on_the_host)
  built = _build(str(tmp_path), "jax", model_fn=py_func, strategy="one_device")
  with pytest.raises(lowering.LoweringError) as raised:
    built.train(fixed_input_fn, max_steps=2)
  message = str(raised.value)
  assert "\n" not in message
  assert "the train step of the model_fn uses the op PyFunc" in message
  assert "--engine=distribute" in message


def test_a_string_feature_is_refused_naming_it(tmp_path):
  built = _build(str(tmp_path), "jax", strategy="one_device")

  def input_fn(params):
    images = np.zeros((8, IMAGE_SIZE, IMAGE_SIZE, 3), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"image": images, "key": ["a"] * 8}, np.zeros(8, np.int32)))
    return dataset.repeat().batch(params["batch_size"], drop_remainder=True)

  with pytest.raises(lowering.LoweringError, match=r"the train input's 0/key is a string tensor"):
    built.train(input_fn, max_steps=2)


def test_unlowerable_messages_name_the_op_and_node():
  error = ("Detected unsupported operations when trying to compile graph __inference_x_1[] on "
           "XLA_GPU_JIT: Conv2D (No registered 'Conv2D' OpKernel for XLA_GPU_JIT devices "
           "compatible with node {{node conv/Conv2D}}){{node conv/Conv2D}}")
  message = lowering.unlowerable_message(error, "train step of the model_fn", "GPU")
  assert message.startswith("the train step of the model_fn uses the op Conv2D (node "
                            "'conv/Conv2D'), which TensorFlow's XLA bridge cannot lower for "
                            "XLA_GPU_JIT")


# Two JAX devices: the child.

def _plain_model_fn(cross_shard, losses):
  """A linear model (no batch norm): two replicas' mean gradient is the global batch's."""
  def model_fn(features, labels, mode, params):
    del params
    flat = tf.reshape(features["image"], [-1, IMAGE_SIZE * IMAGE_SIZE * 3])
    logits = tf.compat.v1.layers.dense(flat, 10, name="logits")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
    if cross_shard:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step())

    def metric_fn(labels, logits):
      predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
      return {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions)}

    def host_call(replica_losses):  # every replica's, concatenated, as on a TPU's host
      def keep(values):
        losses.append(float(np.mean(values)))
        return np.float32(0)
      return [tf.compat.v1.numpy_function(keep, [replica_losses], tf.float32)]

    return stacks.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                                       eval_metrics=(metric_fn, [labels, logits]),
                                       host_call=(host_call, [tf.reshape(loss, [1])]))
  return model_fn


def _odd_eval_input_fn(params):
  """37 records in batches of params['batch_size'], the last one short: no padding."""
  rng = np.random.default_rng(5)
  images = rng.normal(size=(NUM_EVAL, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
  labels = rng.integers(0, 10, size=NUM_EVAL).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(({"image": images}, labels)).batch(
      params["batch_size"])


def _child(out_dir, digits_dir):
  jax.config.update("jax_num_cpu_devices", 2)  # before anything starts JAX's CPU backend
  results = {"devices": len(jax.devices())}
  for name, cross_shard in (("plain", False), ("cross_shard", True)):
    for strategy in ("one_device", "none"):
      model_dir = os.path.join(out_dir, f"{name}_{strategy}")
      losses = []
      built = _build(model_dir, "jax", model_fn=_plain_model_fn(cross_shard, losses),
                     strategy=strategy)
      built.train(fixed_input_fn, max_steps=6)
      results[f"{name}_{strategy}"] = {
          "losses": losses,
          "kernel": float(np.abs(_variables(model_dir)["logits/kernel"]).sum()),
          "eval": {k: float(v) for k, v in built.evaluate(_odd_eval_input_fn).items()},
          "engine": choose.describe_engine(built, _config(model_dir, "jax",
                                                          strategy=strategy).runtime)}
  # Our model (batch norm per replica) on two devices, evaluated exactly: the padded eval set.
  model_dir = os.path.join(out_dir, "tiny")
  shutil.copytree(os.path.join(out_dir, "start"), model_dir)
  steps = input_pipeline.eval_steps(NUM_EVAL, 24)
  for strategy in ("one_device", "none"):
    built = _build(model_dir, "jax", strategy=strategy, eval_batch=24)
    evaluation = built.evaluate(_eval_input_fn(digits_dir, 24), steps=steps)
    results[f"tiny_{strategy}"] = {k: float(v) for k, v in evaluation.items()}
  # A Keras optimizer's apply_gradients exchanges nothing between the replicas: refused.
  try:
    _build(os.path.join(out_dir, "keras"), "jax", model_fn=_keras_optimizer_model_fn).train(
        fixed_input_fn, max_steps=2)
  except collectives.CollectiveError as e:
    results["keras_refusal"] = str(e)
  print(json.dumps(results))
  return 0


def _keras_optimizer_model_fn(features, labels, mode, params):
  flat = tf.reshape(features["image"], [params["batch_size"], -1])
  layer = tf.compat.v1.layers.Dense(10)
  logits = layer(flat)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  variables = layer.trainable_variables
  gradients = tf.gradients(loss, variables)
  updates = [v.assign_sub(0.1 * g) for v, g in zip(variables, gradients)]
  with tf.control_dependencies(updates):
    train_op = tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)
  return stacks.tpu.TPUEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory, digits_dir, two_engines):
  out_dir = tmp_path_factory.mktemp("two_devices")
  shutil.copytree(two_engines["jax"], str(out_dir / "start"))
  # The environment of most of the suite's programs (test_preflight.py's, test_engine_devices.py's):
  # their zygote of tests/programs.py forks this one too, where XLA_FLAGS would start one of its
  # own (TensorFlow loaded again). The child sets its two devices itself.
  env = program_env(TF_CPP_MIN_LOG_LEVEL="3")
  process = programs.run([sys.executable, __file__, str(out_dir), digits_dir], cwd=REPO_DIR,
                           env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECS)
  assert process.returncode == 0, process.stderr[-3000:]
  return json.loads(process.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["plain", "cross_shard"])
def test_two_devices_train_as_one_on_the_global_batch(two_devices, optimizer):
  one, two = two_devices[f"{optimizer}_one_device"], two_devices[f"{optimizer}_none"]
  assert (one["engine"], two["engine"]) == ("jax (1 cpu device)", "jax (2 cpu devices)")
  # The host_call's mean of the replicas' losses: the global batch's loss, step by step.
  assert len(two["losses"]) == len(one["losses"]) == 6
  assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
  assert one["losses"][-1] < one["losses"][0]
  assert two["kernel"] == pytest.approx(one["kernel"], rel=1e-5)
  # The eval set's last batch is short and the batches do not pair up: exact all the same.
  assert two["eval"]["accuracy"] == pytest.approx(one["eval"]["accuracy"], abs=1e-6)
  assert two["eval"]["loss"] == pytest.approx(one["eval"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_two_devices_evaluate_our_model_as_one(two_devices):
  one, two = two_devices["tiny_one_device"], two_devices["tiny_none"]
  assert two["num_eval_examples"] == one["num_eval_examples"] == NUM_EVAL
  # (Not `loss`: our loss is a mean over the weighted examples of a replica's batch, and the
  # padding makes the replicas' counts of them differ; eval_loss is the metric's, exact.)
  for name in ("accuracy", "eval_loss", "macro_f1", "top_5_accuracy", "mean_per_class_accuracy"):
    assert two[name] == pytest.approx(one[name], abs=1e-5), name


@pytest.mark.slow
def test_a_train_op_without_a_gradient_exchange_is_refused_on_two_devices(two_devices):
  message = two_devices["keras_refusal"]
  assert "no gradient sum over the 2 replicas" in message
  assert "--strategy=one_device" in message and "\n" not in message


if __name__ == "__main__":
  sys.exit(_child(sys.argv[1], sys.argv[2]))


# train.py with --engine=jax, as a user runs it.

TINY = ["--model=tiny", f"--image_size={IMAGE_SIZE}", "--train_batch_size=8",
        "--eval_batch_size=8", "--norandom_flip", "--seed=1", "--iterations_per_loop=2"]


@pytest.mark.slow
def test_train_py_runs_the_jax_engine_quietly_and_names_it(tmp_path, digits_dir):
  model_dir, export_dir = str(tmp_path / "model"), str(tmp_path / "export")
  done = programs.run(
      [sys.executable, "train.py", f"--data_dir={digits_dir}", f"--model_dir={model_dir}",
       "--train_steps=4", "--steps_per_eval=2", "--engine=jax", f"--export_dir={export_dir}",
       *TINY], cwd=REPO_DIR, env=program_env(), capture_output=True, text=True, timeout=240,
      fresh=True)  # its start-up too is checked quiet
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  assert lines[0] == "[estimator_tpu] engine: jax (1 cpu device)"
  assert any(line.startswith("[estimator_tpu] step 4/4 | accuracy=") and
             f"num_eval_examples={NUM_EVAL}" in line for line in lines)
  assert any(line.startswith("[estimator_tpu] exported SavedModel to ") for line in lines)
  assert "W0000" not in done.stderr and "WARNING:tensorflow" not in done.stderr, done.stderr
  assert "call_tf" not in done.stderr and "jax" not in done.stderr.lower(), done.stderr
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["runtime"]["engine"] == "jax"
  # The export serves the run's own accuracy: its predictions on the validation images are
  # the evaluation's of the same checkpoint, image for image.
  from estimator_tpu.run import curves
  from estimator_tpu.serving import predict
  history = curves.read_history(model_dir)
  assert [record["step"] for record in history] == [2, 4]
  [version] = os.listdir(export_dir)
  predictor = predict.Predictor(os.path.join(export_dir, version))
  items = list(predict.tfrecord_items(sorted(glob.glob(os.path.join(digits_dir,
                                                                    "validation-*")))))
  results = predictor.predict([item.image_bytes for item in items])
  correct = sum(predict.is_correct(item, result, predictor.class_names)
                for item, result in zip(items, results))
  assert len(results) == NUM_EVAL
  assert correct / NUM_EVAL == pytest.approx(history[-1]["accuracy"], abs=1e-6)
