"""examples/legacy_corpus: TF 1.15 programs, only their import line changed, run end to end on CPU.

Each program runs in its own process, as a user would run it: train, evaluate,
predict or export; then `python -m estimator_tpu.compat check` reads them all.
"""

import ast
import glob
import json
import os
import re
import sys

from conftest import program_env
from conftest import summary_tags
import numpy as np
import programs
import pytest
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "examples", "legacy_corpus")
PROGRAMS = sorted(glob.glob(os.path.join(CORPUS, "*", "*.py")))
COMPAT_LINE = "from estimator_tpu.compat import tf"
TF2_LINE = "from estimator_tpu.compat import tf2 as tf"
# The line each program had before, by folder: TF 1.15's unless named here.
ORIGINAL_LINES = {"albert_like": "import tensorflow.compat.v1 as tf",
                  "mnasnet_like": "import tensorflow.compat.v1 as tf",
                  "tf2_estimators": "import tensorflow as tf"}
BERT_CONFIG = {"vocab_size": 30, "hidden_size": 16, "num_hidden_layers": 1,
               "num_attention_heads": 2, "intermediate_size": 32,
               "max_position_embeddings": 16}
INIT_VALUE = 0.25


def _run(program, *args, fresh=False):
  """Runs a corpus program as a script; returns its stderr (the TF log).

  Forked from a process with TensorFlow loaded (tests/programs.py), unless fresh:
  mnist_like starts a new Python, so that one log of test_runs_are_quiet holds a
  corpus program's start-up too; the others' logs hold all they print after it.
  """
  done = programs.run(
      [sys.executable, os.path.join(CORPUS, program), *args], cwd=REPO, fresh=fresh,
      capture_output=True, text=True, timeout=300,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="2"))
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
  return done.stderr


def _results(path):
  """`key = value` lines (BERT's eval_results.txt) as a dict of floats."""
  with open(path) as f:
    return {key: float(value) for key, value in
            (line.strip().split(" = ") for line in f if line.strip())}


def _steps(model_dir):
  return sorted(int(p.rsplit("-", 1)[1].split(".")[0])
                for p in glob.glob(os.path.join(model_dir, "model.ckpt-*.index")))


def _write_init_checkpoint(path):
  """A "pre-trained" checkpoint holding only the word embeddings, all INIT_VALUE."""
  with tf.Graph().as_default():
    tf.compat.v1.get_variable(
        "bert/embeddings/word_embeddings",
        initializer=tf.fill([BERT_CONFIG["vocab_size"], BERT_CONFIG["hidden_size"]],
                            INIT_VALUE))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return tf.compat.v1.train.Saver().save(session, path)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  root = tmp_path_factory.mktemp("bert_like")
  config = root / "bert_config.json"
  config.write_text(json.dumps(BERT_CONFIG))
  init_checkpoint = _write_init_checkpoint(str(root / "pretrained" / "model.ckpt"))
  output_dir = str(root / "output")
  log = _run("bert_like/run_classifier.py", f"--bert_config_file={config}",
             f"--output_dir={output_dir}", f"--init_checkpoint={init_checkpoint}",
             "--do_train", "--do_eval", "--do_predict", "--num_train_examples=64",
             "--train_batch_size=8", "--num_eval_examples=16", "--eval_batch_size=8",
             "--save_checkpoints_steps=4")
  return {"output_dir": output_dir, "log": log}


def test_bert_like_trains_evaluates_and_predicts(bert):
  # 64 examples / batch 8 x 1 epoch = 8 steps; a checkpoint every 4.
  assert _steps(bert["output_dir"]) == [0, 4, 8]
  results = _results(os.path.join(bert["output_dir"], "eval_results.txt"))
  assert set(results) == {"eval_accuracy", "eval_loss", "global_step", "loss"}
  assert results["global_step"] == 8 and 0.0 <= results["eval_accuracy"] <= 1.0
  probabilities = np.loadtxt(os.path.join(bert["output_dir"], "test_results.tsv"))
  assert probabilities.shape == (16, 2)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_bert_like_starts_from_the_init_checkpoint_through_scaffold_fn(bert):
  newest = tf.train.latest_checkpoint(bert["output_dir"])
  embeddings = tf.train.load_variable(newest, "bert/embeddings/word_embeddings")
  # 8 Adam steps of at most ~1e-3 each from 0.25; a fresh init is N(0, 0.02).
  assert embeddings.shape == (30, 16)
  assert np.abs(embeddings - INIT_VALUE).max() < 0.02
  assert not np.allclose(embeddings, INIT_VALUE)  # and training moved them
  assert "name = bert/embeddings/word_embeddings:0, shape = (30, 16), *INIT_FROM_CKPT*" in (
      bert["log"])
  # The custom optimizer's slots are in the checkpoint under its names.
  names = {name for name, _ in tf.train.list_variables(newest)}
  assert "bert/embeddings/word_embeddings/adam_m" in names


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
  root = tmp_path_factory.mktemp("resnet_like")
  model_dir, export_dir = str(root / "model"), str(root / "export")
  common = [f"--model_dir={model_dir}", "--train_steps=10", "--iterations_per_loop=5",
            "--train_batch_size=32", "--eval_batch_size=32", "--num_eval_images=256"]
  train_log = _run("resnet_like/resnet_main.py", "--mode=train", *common)
  eval_log = _run("resnet_like/resnet_main.py", "--mode=eval", "--eval_timeout=3",
                  f"--export_dir={export_dir}", *common)
  return {"model_dir": model_dir, "export_dir": export_dir, "log": train_log + eval_log}


def test_resnet_like_async_checkpoints_every_loop(resnet):
  assert _steps(resnet["model_dir"]) == [0, 5, 10]


def test_resnet_like_eval_job_evaluates_the_final_checkpoint_and_exports(resnet):
  with open(os.path.join(resnet["model_dir"], "eval_results.txt")) as f:
    lines = f.read().splitlines()
  assert len(lines) == 1  # the newest checkpoint is step 10 = train_steps: loop ends
  results = dict(item.split("=") for item in lines[0].split())
  assert set(results) == {"global_step", "loss", "top_1_accuracy", "top_5_accuracy"}
  assert int(results["global_step"]) == 10
  assert 0.0 <= float(results["top_1_accuracy"]) <= float(results["top_5_accuracy"]) <= 1.0
  assert "Evaluation finished after training step 10" in resnet["log"]
  (version,) = os.listdir(resnet["export_dir"])
  serve = tf.saved_model.load(os.path.join(resnet["export_dir"], version))
  outputs = serve.signatures["classify"](tf.zeros([3, 8, 8, 3]))
  assert outputs["probabilities"].shape == (3, 10) and outputs["classes"].shape == (3,)


def test_resnet_like_host_call_wrote_contrib_summaries(resnet):
  assert {"loss", "learning_rate"} <= summary_tags(resnet["model_dir"])


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
  root = tmp_path_factory.mktemp("mnist_like")
  model_dir, export_dir = str(root / "model"), str(root / "export")
  log = _run("mnist_like/mnist_tpu.py", f"--model_dir={model_dir}",
             f"--export_dir={export_dir}", "--train_steps=40", "--batch_size=64",
             "--eval_steps=4", "--predict_examples=10", fresh=True)
  return {"model_dir": model_dir, "export_dir": export_dir, "log": log}


def test_mnist_like_trains_evaluates_predicts_and_exports(mnist):
  assert _steps(mnist["model_dir"])[-1] == 40
  results = _results(os.path.join(mnist["model_dir"], "eval_results.txt"))
  assert set(results) == {"accuracy", "global_step", "loss"}
  assert results["global_step"] == 40
  predictions = np.loadtxt(os.path.join(mnist["model_dir"], "predictions.txt"))
  assert predictions.shape == (10, 11)  # class id, then 10 probabilities
  # The class id is the most probable class (probabilities are written to 4 places: ties allowed).
  chosen = predictions[np.arange(10), 1 + predictions[:, 0].astype(int)]
  np.testing.assert_array_equal(chosen, predictions[:, 1:].max(axis=1))
  (version,) = os.listdir(mnist["export_dir"])
  serve = tf.saved_model.load(os.path.join(mnist["export_dir"], version))
  outputs = serve.signatures["classify"](image=tf.zeros([4, 8, 8]))
  assert outputs["probabilities"].shape == (4, 10) and outputs["class_ids"].shape == (4,)


@pytest.mark.parametrize("program", ["bert", "resnet", "mnist", "efficientnet", "albert",
                                     "mnasnet", "slim_model", "detection"])
def test_runs_are_quiet(program, request):
  log = request.getfixturevalue(program)["log"]
  assert "is deprecated" not in log
  assert not re.search(r"estimator_tpu/", log), [
      line for line in log.splitlines() if "estimator_tpu/" in line][:5]
  assert log.count("estimator_tpu.compat active") <= 1


# --- the programs' source -----------------------------------------------------------------


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: os.path.relpath(p, CORPUS))
def test_the_import_line_is_the_only_difference_from_the_original(path):
  with open(path) as f:
    source = f.read()
  lines = source.splitlines()
  ours = TF2_LINE if TF2_LINE in lines else COMPAT_LINE
  original = ORIGINAL_LINES.get(os.path.basename(os.path.dirname(path)), "import tensorflow as tf")
  assert lines.count(ours) == 1, path
  assert original not in lines
  # Put back the original line: nothing of this project is left in the program.
  original_source = source.replace(ours, original)
  assert "estimator_tpu" not in original_source
  tree = ast.parse(original_source)
  bound = [alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
           for alias in node.names if alias.name in ("tensorflow", "tensorflow.compat.v1")]
  assert bound == ["tf"]


def test_compat_check_finds_no_unknown_or_refused_name():
  # Forked from the zygote of this file's programs: the same environment, TensorFlow's log
  # level too (the verdicts are on stdout, its C++ log on stderr).
  done = programs.run([sys.executable, "-m", "estimator_tpu.compat", "check", *PROGRAMS],
                      cwd=REPO, capture_output=True, text=True, timeout=120,
                      env=program_env(TF_CPP_MIN_LOG_LEVEL="2"))
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  verdicts = [line for line in done.stdout.splitlines() if " TF names (" in line]
  assert len(verdicts) == len(PROGRAMS)
  for line in verdicts:
    assert "0 refused, 0 unknown" in line and line.endswith("runs with only its import line "
                                                            "changed"), line
  used = done.stdout
  main = os.path.join(CORPUS, "resnet_like", "resnet_main.py")
  for expected in (
      "tensorflow.contrib.summary  mapped",
      "tensorflow.contrib.tpu.python.tpu.async_checkpoint.AsyncCheckpointSaverHook  "
      "re-implemented",
      "tensorflow.contrib.training.python.training.evaluation.checkpoints_iterator  mapped",
      "tensorflow.contrib.training.python.training.evaluation.wait_for_new_checkpoint  mapped"):
    assert re.search(rf"^{re.escape(main)}:\d+: {re.escape(expected)}", used, re.M), expected
  assert re.search(r"bert_like/modeling.py:\d+: tf\.Dimension  mapped", used)
  assert re.search(r"bert_like/optimization.py:\d+: tf\.train\.Optimizer  mapped", used)
  assert re.search(r"mnist_like/mnist_tpu.py:\d+: tf\.contrib\.tpu\.CrossShardOptimizer  "
                   r"re-implemented", used)


# --- 2019 TPU image model, 2022-23 form ------------------------------------------------------


@pytest.fixture(scope="module")
def efficientnet(tmp_path_factory):
  root = tmp_path_factory.mktemp("efficientnet_like")
  model_dir, export_dir = str(root / "model"), str(root / "export")
  log = _run("efficientnet_like/main.py", f"--model_dir={model_dir}",
             f"--export_dir={export_dir}", "--train_steps=10", "--iterations_per_loop=5")
  return {"model_dir": model_dir, "export_dir": export_dir, "log": log}


def test_efficientnet_like_trains_with_its_batch_norm_subclass_and_exports(efficientnet):
  model_dir = efficientnet["model_dir"]
  results = _results(os.path.join(model_dir, "eval_results.txt"))
  assert results["global_step"] == 10
  assert 0.0 <= results["top_1_accuracy"] <= results["top_5_accuracy"] <= 1.0
  names = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir))}
  # TpuBatchNormalization's statistics, and the moving average the eval and export restore.
  assert "stem_bn/moving_mean" in names
  assert "stem_bn/moving_mean/ExponentialMovingAverage" in names
  assert "head/kernel/ExponentialMovingAverage" in names
  moving_mean = tf.train.load_variable(model_dir, "stem_bn/moving_mean")
  assert np.abs(moving_mean).max() > 0  # _moments ran in training: the statistics moved
  assert {"learning_rate", "current_epoch", "cross_entropy"} <= summary_tags(model_dir)
  (version,) = os.listdir(efficientnet["export_dir"])
  serve = tf.saved_model.load(os.path.join(efficientnet["export_dir"], version))
  outputs = serve.signatures["classify"](tf.zeros([2, 8, 8, 3]))
  np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)


@pytest.fixture(scope="module")
def mnasnet(tmp_path_factory):
  root = tmp_path_factory.mktemp("mnasnet_like")
  model_dir, export_dir = str(root / "model"), str(root / "export")
  log = _run("mnasnet_like/mnasnet_main.py", f"--model_dir={model_dir}",
             f"--export_dir={export_dir}", "--train_steps=10")
  return {"model_dir": model_dir, "export_dir": export_dir, "log": log}


def test_mnasnet_like_compat_v1_form_trains_its_batch_norm_subclass_and_exports(mnasnet):
  model_dir = mnasnet["model_dir"]
  results = _results(os.path.join(model_dir, "eval_results.txt"))
  assert results["global_step"] == 10 and 0.0 <= results["top_1_accuracy"] <= 1.0
  assert np.abs(tf.train.load_variable(model_dir, "stem_bn/moving_mean")).max() > 0
  names = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir))}
  assert "logits/kernel/ExponentialMovingAverage" in names
  (version,) = os.listdir(mnasnet["export_dir"])
  serve = tf.saved_model.load(os.path.join(mnasnet["export_dir"], version))
  probabilities = serve.signatures["serving_default"](tf.zeros([2, 8, 8, 3]))["probabilities"]
  np.testing.assert_allclose(probabilities.numpy().sum(axis=1), 1.0, rtol=1e-5)


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
  output_dir = str(tmp_path_factory.mktemp("albert_like"))
  log = _run("albert_like/run_pretraining.py", f"--output_dir={output_dir}", "--do_train",
             "--do_eval", "--num_train_steps=8", "--save_checkpoints_steps=4")
  return {"output_dir": output_dir, "log": log}


def test_albert_like_runs_through_tensorflow_compat_v1_estimator(albert):
  results = _results(os.path.join(albert["output_dir"], "eval_results.txt"))
  assert set(results) == {"global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                          "sentence_order_accuracy"}
  assert results["global_step"] == 8
  assert _steps(albert["output_dir"]) == [0, 4, 8]
  # Two heads: the loss is the masked-LM loss plus the sentence-order loss (ln 2 at chance).
  assert results["loss"] > results["masked_lm_loss"] > 0


# --- TF 2-era estimator code: `from estimator_tpu.compat import tf2 as tf` --------------------


def _tf2_results(program, tmp_path_factory, *args):
  model_dir = tmp_path_factory.mktemp(os.path.splitext(program)[0])
  _run(f"tf2_estimators/{program}", f"--model_dir={model_dir}", *args)
  with open(model_dir / "results.json") as f:
    return json.load(f)


def test_premade_estimators_report_the_mean_loss_and_serve_what_they_predict(tmp_path_factory):
  export_dir = tmp_path_factory.mktemp("census_export")
  results = _tf2_results("census_premade.py", tmp_path_factory, f"--export_dir={export_dir}")
  for name in ("linear", "dnn"):
    metrics = results[name]
    # TF 2's reduction: `loss` is a mean over examples, as `average_loss` is (TF 1's summed
    # over a batch of 64, ~64x larger).
    assert metrics["loss"] == pytest.approx(metrics["average_loss"], rel=0.05)
    assert metrics["accuracy"] > 0.8  # the label follows the columns
    assert metrics["global_step"] == 60
  served = np.array(results["served_probabilities"])
  assert served.shape == (8, 2)
  np.testing.assert_allclose(served, np.array(results["predicted_probabilities"]), atol=1e-5)


def test_keras_model_fn_hooks_and_model_to_estimator(tmp_path_factory):
  results = _tf2_results("iris_keras.py", tmp_path_factory, "--train_steps=150")
  assert results["hook_steps"] == 150
  for name in ("custom", "keras"):
    assert results[name]["global_step"] == 150
    assert results[name]["accuracy"] > 0.7, results


def test_a_warm_started_wide_and_deep_starts_from_the_first_run(tmp_path_factory):
  results = _tf2_results("warm_start.py", tmp_path_factory, "--train_steps=40")
  moved = results["moved_by_one_step"]
  assert set(moved) >= {"dnn/hiddenlayer_0/kernel", "dnn/logits/kernel",
                        "linear/linear_model/color/weights"}
  assert max(moved.values()) < 0.5  # one step from the first run's weights
  metrics = results["metrics"]
  assert metrics["global_step"] == 1
  # After one step of its own it classifies as well as the first run had learned to.
  assert metrics["accuracy"] > metrics["accuracy_baseline"] + 0.2


# --- slim-era and graph-mode programs ----------------------------------------------------------


@pytest.fixture(scope="module")
def slim_model(tmp_path_factory):
  root = tmp_path_factory.mktemp("slim_like")
  model_dir, export_dir = str(root / "model"), str(root / "export")
  log = _run("slim_like/inception_main.py", f"--data_dir={root / 'data'}",
             f"--model_dir={model_dir}", f"--export_dir={export_dir}", "--train_steps=10",
             "--iterations_per_loop=5")
  return {"model_dir": model_dir, "export_dir": export_dir, "log": log}


def test_slim_like_keeps_slims_variable_names_and_restores_the_moving_average(slim_model):
  model_dir = slim_model["model_dir"]
  results = _results(os.path.join(model_dir, "eval_results.txt"))
  assert results["global_step"] == 10 and 0.0 <= results["accuracy"] <= 1.0
  names = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(model_dir))}
  # slim.conv2d under Inception's arg_scope, slim.nets' bottleneck: slim's names, as TF 1.15 made.
  assert {"conv1/weights", "conv1/BatchNorm/beta", "conv1/BatchNorm/moving_mean",
          "block1/shortcut/weights", "block1/conv3/BatchNorm/moving_variance",
          "logits/weights", "logits/biases"} <= names
  assert "logits/weights/ExponentialMovingAverage" in names
  assert "Restoring parameters from" in slim_model["log"]
  (version,) = os.listdir(slim_model["export_dir"])
  serve = tf.saved_model.load(os.path.join(slim_model["export_dir"], version))
  # The export restored the moving averages: its logits layer holds their values.
  exported = {v.name.split(":")[0]: v.numpy() for v in serve.variables}
  np.testing.assert_allclose(
      exported["logits/weights"],
      tf.train.load_variable(model_dir, "logits/weights/ExponentialMovingAverage"))
  jpeg = tf.io.encode_jpeg(tf.zeros([24, 24, 3], tf.uint8)).numpy()
  outputs = serve.signatures["classify"](tf.constant([jpeg, jpeg]))
  np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("detection_like") / "model")
  log = _run("detection_like/detection_main.py", f"--model_dir={model_dir}", "--train_steps=10",
             "--iterations_per_loop=5")
  return {"model_dir": model_dir, "log": log}


def test_detection_like_main_writes_eval_summaries_with_a_file_writer(detection):
  model_dir = detection["model_dir"]
  results = _results(os.path.join(model_dir, "coco_metrics.txt"))
  assert results["global_step"] == 10
  assert 0.0 <= results["AP50"] <= 1.0 and 0.0 <= results["mean_iou"] <= 1.0
  (events,) = glob.glob(os.path.join(model_dir, "coco_eval", "events.out.tfevents.*"))
  written = {(value.tag, event.step): value.simple_value
             for event in tf.compat.v1.train.summary_iterator(events)
             for value in event.summary.value}
  assert written == {(name, 10): pytest.approx(value, rel=1e-6)
                     for name, value in results.items() if name != "global_step"}


def test_gfile_like_reads_and_writes_through_tf_1_module_paths(tmp_path):
  text = tmp_path / "text"
  text.mkdir()
  (text / "train.txt").write_text("the cat sat\non the mat\nthe end\n")
  (text / "valid.txt").write_text("the cat\n")
  save_dir = tmp_path / "out"
  _run("gfile_like/data_utils.py", f"--data_dir={text}", f"--save_dir={save_dir}",
       "--seq_len=3")
  vocab = (save_dir / "vocab.txt").read_text().split()
  assert vocab == ["<eos>", "the", "cat", "end", "mat", "on", "sat"]  # by count, then word
  info = json.loads((save_dir / "corpus-info.json").read_text())
  # 11 train tokens in chunks of 3 with one to predict: 3 examples; valid's 3 tokens: 0.
  assert info == {"vocab_size": 7, "seq_len": 3, "num_examples": {"train": 3, "valid": 0}}
  record = next(tf.compat.v1.io.tf_record_iterator(str(save_dir / "train.seq_len-3.tfrecords")))
  example = tf.train.Example.FromString(record)
  assert list(example.features.feature["inputs"].int64_list.value) == [1, 2, 6]
  assert list(example.features.feature["labels"].int64_list.value) == [2, 6, 0]
