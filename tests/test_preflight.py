"""train.py --preflight: on CPU, what a TPU run needs; one PASS/WARN/FAIL line per finding."""

import contextlib
import importlib.util
import io
import os
import sys

from absl import flags
from conftest import IMAGE_SIZE
from conftest import program_env
from conftest import tiny_config
import preflight_models
import programs
import pytest
import tensorflow as tf

from estimator_tpu import flags as flags_lib
from estimator_tpu import stacks
from estimator_tpu.cli import train
from estimator_tpu.data import input_pipeline
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.tpu import checks as tpu_checks
from estimator_tpu.tpu import findings as findings_lib
from estimator_tpu.tpu import preflight

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# These compile one core's step with XLA on the CPU, which the tpu stack's TensorFlow lacks; there
# the preflight says so (test_the_step_check_needs_xla_for_the_cpu).
needs_host_xla = pytest.mark.skipif(not stacks.HOST_XLA,
                                    reason="the TPU build of TensorFlow has no XLA for the CPU")


def _run(digits_dir, model_dir, *extra):
  """train.run(--preflight ...) in this process; returns the exit status."""
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  train.define_entry_flags(flag_values)
  flag_values(["train.py", "--preflight", f"--data_dir={digits_dir}",
               f"--model_dir={model_dir}", f"--image_size={IMAGE_SIZE}", *extra])
  return train.run(flag_values)


def _lines(text, status):
  return [line for line in text.splitlines() if line.startswith(status + "  ")]


def test_the_step_check_needs_xla_for_the_cpu(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--use_tpu", "--model=tiny", "--train_batch_size=64",
                "--eval_batch_size=64")
  out = capsys.readouterr().out
  assert "TPUs cannot run" not in out  # every op of the tiny model is in the TPU's table
  steps = [line for line in out.splitlines() if "one core's" in line]
  if stacks.HOST_XLA:
    assert status == 0, out
    assert len(steps) == 2 and all(line.startswith("PASS") for line in steps), out
  else:
    assert status == 1, out
    assert len(steps) == 2 and all(line.startswith("FAIL") for line in steps), out
    assert all("has no XLA for the CPU; run --preflight on the current stack" in line
               for line in steps), out
    assert any("CrossShardOptimizer" in line for line in _lines(out, "PASS")), out


@pytest.fixture(scope="module")
def distribute_report(digits_dir, tmp_path_factory):
  """(status, stdout, the model_fn's calls, --model_dir) of one --engine=distribute report.

  On 8 cores with the model_fn recording its calls: the step check and what the engine gives
  the model_fn read the same report, made once.
  """
  model_dir = tmp_path_factory.mktemp("distribute") / "model"
  preflight_models.CALLS.clear()
  with contextlib.redirect_stdout(io.StringIO()) as out:
    status = _run(digits_dir, model_dir, "--use_tpu", "--engine=distribute", "--model=tiny",
                  "--train_batch_size=64", "--eval_batch_size=128",
                  "--model_fn=preflight_models:recording_model_fn")
  return status, out.getvalue(), list(preflight_models.CALLS), model_dir


def test_the_engine_step_check_needs_xla_for_the_cpu(distribute_report):
  status, out, _, _ = distribute_report
  steps = [line for line in out.splitlines() if "distribute engine" in line and
           ("training step" in line or "evaluation step" in line)]
  assert len(steps) == 2, out
  if stacks.HOST_XLA:
    assert status == 0 and all(line.startswith("PASS") for line in steps), out
  else:
    assert status == 1 and all(line.startswith("FAIL") for line in steps), out
    assert all("has no XLA for the CPU; run --preflight on the current stack" in line
               for line in steps), out


@needs_host_xla
def test_default_model_passes_on_digits_with_per_core_batch_8(digits_dir, tmp_path):
  model_dir = tmp_path / "model"
  result = programs.run(
      [sys.executable, "train.py", "--preflight", f"--data_dir={digits_dir}",
       f"--model_dir={model_dir}", "--use_tpu", f"--image_size={IMAGE_SIZE}",
       "--train_batch_size=64", "--eval_batch_size=64"],
      cwd=REPO_DIR, capture_output=True, text=True, timeout=120,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="3"))
  out = result.stdout
  assert result.returncode == 0, out + result.stderr[-3000:]
  assert not _lines(out, "FAIL")
  passes = "\n".join(_lines(out, "PASS"))
  # --augment_on=auto: on a TPU the cores flip, jitter and normalize.
  assert ("train input per core: features['augmentation'] float32 [8, 3], "
          "features['image'] bfloat16 [8, 32, 32, 3], labels int32 [8]" in passes)
  assert "features['weight'] float32 [8]" in passes  # the eval input
  assert "compiles with XLA and runs on a real batch" in passes
  assert "CrossShardOptimizer" in passes
  assert "TPU train graph for 8 cores" in passes and "TPU eval graph for 8 cores" in passes
  assert out.splitlines()[-1].startswith("preflight: PASS")
  assert not model_dir.exists()  # a check, not a run: nothing written


def _op_failures(out, op_type):
  """The FAIL lines naming op_type; where the CPU has XLA, the only FAIL lines."""
  failures = _lines(out, "FAIL")
  named = [line for line in failures if op_type in line]
  if stacks.HOST_XLA:
    assert named == failures, out
  else:  # the tpu stack also says its TensorFlow cannot compile the steps on CPU
    assert all("has no XLA for the CPU" in line for line in failures if line not in named), out
  return named


def test_random_rotation_in_the_model_fails_naming_the_op(digits_dir, tmp_path, capsys):
  # The tiny network inside the user's model_fn, here and below: a finding names what the
  # model_fn adds to ours, whichever network that wraps (the default network's own report is
  # test_default_model_passes_on_digits_with_per_core_batch_8's), at a third of the CPU.
  status = _run(digits_dir, tmp_path, "--model=tiny", "--train_batch_size=64",
                "--eval_batch_size=64", "--model_fn=preflight_models:rotating_model_fn")
  out = capsys.readouterr().out
  assert status == 1
  (failure,) = _op_failures(out, "ImageProjectiveTransformV3")
  assert failure.startswith("FAIL  TRAIN step: TPUs cannot run ImageProjectiveTransformV3 (node "
                            "augment_rotation/transform/ImageProjectiveTransformV3)")
  assert "not among the ops TensorFlow's TPU compiler supports" in failure
  assert "'augment_rotation/transform'" in failure  # the Keras layer's scope
  assert "preflight_models.py:" in failure  # the line that made it
  assert out.splitlines()[-1].startswith("preflight: FAIL")


@needs_host_xla
def test_batch_that_does_not_divide_by_the_cores_is_a_fail_line(digits_dir, tmp_path, capsys):
  # With --use_tpu the config check alone would stop here; preflight reports instead.
  status = _run(digits_dir, tmp_path, "--use_tpu", "--model=tiny", "--train_batch_size=100",
                "--eval_batch_size=64")
  out = capsys.readouterr().out
  assert status == 1
  (failure,) = _lines(out, "FAIL")
  assert "--train_batch_size=100" in failure and "--num_cores=8" in failure
  assert "try 96 or 104" in failure
  assert any("compiles with XLA" in line for line in _lines(out, "PASS"))  # checks went on


def test_input_fn_without_drop_remainder_fails_naming_the_dynamic_dimension(digits_dir,
                                                                           tmp_path):
  config = tiny_config(tmp_path, train_batch_size=64, eval_batch_size=64)
  good = input_pipeline.make_input_fn(os.path.join(digits_dir, "train-*"), True, IMAGE_SIZE)

  def without_drop_remainder(params):
    return good(params).unbatch().batch(params["batch_size"])

  findings = preflight.run_checks(config, model_fn_lib.model_fn, without_drop_remainder)
  failures = [f.message for f in findings if f.status == findings_lib.FAIL]
  assert any("features['image'] has shape [None, 32, 32, 3], dimension 0 not static" in m
             for m in failures), failures
  assert any("labels has shape [None], dimension 0" in m for m in failures), failures


@pytest.mark.parametrize("engine", ["estimator", pytest.param("distribute", marks=needs_host_xla)])
def test_python_callbacks_and_string_ops_in_the_model_are_errors(digits_dir, tmp_path, engine):
  config = tiny_config(tmp_path, train_batch_size=64, eval_batch_size=64).replace(
      "runtime", engine=engine)
  train_fn = input_pipeline.make_input_fn(os.path.join(digits_dir, "train-*"), True,
                                          IMAGE_SIZE)
  findings = preflight.run_checks(config, preflight_models.callback_model_fn, train_fn)
  failures = "\n".join(f.message for f in findings if f.status == findings_lib.FAIL)
  assert "EagerPyFunc op host_identity" in failures and "Python callback" in failures
  assert "StringFormat op loss_message" in failures and "string tensors" in failures


def test_layer_widths_follow_the_tpu_performance_guide():
  layers = [("net/conv1", "conv", 27, 32), ("net/conv2", "conv", 288, 20),
            ("net/big", "dense", 4096, 1000), ("net/logits", "dense", 1000, 10)]
  findings = preflight.check_layer_widths(layers, num_classes=10)
  assert [f.status for f in findings] == [findings_lib.WARN, findings_lib.WARN]
  assert "net/conv2 (conv, 20 outputs)" in findings[0].message
  assert "net/big (dense, 4096 inputs, 1000 outputs)" in findings[1].message
  assert "logits" not in " ".join(f.message for f in findings)  # the classifier is exempt


def test_per_core_batch_not_a_multiple_of_8_is_a_warning():
  config = tiny_config("/unused", train_batch_size=32, eval_batch_size=64)
  train_finding, eval_finding = preflight.check_batches(config)
  assert train_finding.status == findings_lib.WARN and "gives each of the 8 cores 4" in (
      train_finding.message)
  assert eval_finding.status == findings_lib.PASS


def test_unsupported_op_message_is_parsed_into_op_type_and_scope():
  message = ("Detected unsupported operations when trying to compile graph cluster_1[] on "
             "XLA_CPU_JIT: ImageProjectiveTransformV3 (No registered "
             "'ImageProjectiveTransformV3' OpKernel for XLA_CPU_JIT devices compatible with "
             "node {{node net/rotate/transform/ImageProjectiveTransformV3}}){{node "
             "net/rotate/transform/ImageProjectiveTransformV3}}")
  (op,) = preflight.tpu_checks.parse_unsupported_ops(message, tf.Graph())
  assert (op.op_type, op.scope) == ("ImageProjectiveTransformV3", "net/rotate/transform")


@needs_host_xla
def test_pod_of_four_hosts_checks_every_host_is_fed_and_eval_is_exact(digits_dir, tmp_path,
                                                                      capsys):
  # The fixture has 2 train shards: fewer than the 4 hosts, so hosts shard by record.
  status = _run(digits_dir, tmp_path, "--use_tpu", "--model=tiny", "--num_cores=32",
                "--train_batch_size=256", "--eval_batch_size=256")
  out = capsys.readouterr().out
  assert status == 0, out
  passes = _lines(out, "PASS")
  assert any(line.startswith("PASS  train input on 4 hosts x 8 cores: every host feeds its 8 "
                             "cores every step (fewer non-empty files than hosts")
             for line in passes), passes
  assert ("PASS  eval input on 4 hosts: 37 records counted once each in 1 step; every host "
          "feeds exactly 8 batches") in passes


def test_pod_cores_must_fill_whole_hosts(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--use_tpu", "--model=tiny", "--num_cores=12",
                "--train_batch_size=96", "--eval_batch_size=96")
  out = capsys.readouterr().out
  assert status == 1
  (failure,) = _lines(out, "FAIL")
  assert "--num_cores=12 must be a whole number of hosts of --cores_per_host=8" in failure


def test_an_op_only_the_eval_step_builds_fails_naming_eval(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--model=tiny", "--train_batch_size=64",
                "--eval_batch_size=64", "--model_fn=preflight_models:eval_rotating_model_fn")
  out = capsys.readouterr().out
  assert status == 1
  if stacks.HOST_XLA:
    assert any(line.startswith("PASS  one core's training step") for line in _lines(out, "PASS"))
  (failure,) = _op_failures(out, "ImageProjectiveTransformV3")
  assert failure.startswith("FAIL  EVAL step: TPUs cannot run ImageProjectiveTransformV3")
  assert "'eval_rotation/transform'" in failure


@needs_host_xla
def test_summary_ops_in_the_model_fn_warn_with_the_host_call_way(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--model=tiny", "--train_batch_size=64",
                "--eval_batch_size=64", "--model_fn=preflight_models:summary_model_fn")
  out = capsys.readouterr().out
  assert status == 0  # a warning: the run would fail on the TPU only when it writes them
  (warning,) = [w for w in _lines(out, "WARN") if "summary call" in w]
  assert "tf.compat.v1.summary.scalar('loss_in_model_fn')" in warning
  assert "host_call=(host_call_fn" in warning


def test_a_dtype_the_tpu_lacks_fails_naming_the_tensor(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--model=tiny", "--train_batch_size=64",
                "--eval_batch_size=64", "--model_fn=preflight_models:complex128_model_fn")
  out = capsys.readouterr().out
  assert status == 1
  failures = [f for f in _lines(out, "FAIL") if "complex128" in f]
  assert failures and "loss_as_complex128" in failures[0], out


def test_graph_execution_errors_are_reported_by_their_cause():
  from estimator_tpu.tpu import checks
  message = ("Graph execution error:\n\nDetected at node 'model/cast' defined at (most recent "
             "call last):\n  File \"my_model.py\", line 3, in model_fn\n<stack traces unavailable>"
             "\nCast string to float is not supported\n\t [[{{node model/cast}}]]")
  assert checks.first_line(message) == "node model/cast: Cast string to float is not supported"
  assert checks.first_line("just one line") == "just one line"


@needs_host_xla
def test_distribute_engine_compiles_its_own_steps_for_one_replica(distribute_report):
  status, out, recorded, model_dir = distribute_report
  assert status == 0, out
  assert "--num_cores=8 (--use_tpu), engine distribute" in out.splitlines()[0]
  passes = [line for line in _lines(out, "PASS") if "distribute engine's per-replica" in line]
  assert [line.split(" step ")[0] for line in passes] == [
      "PASS  the distribute engine's per-replica training",
      "PASS  the distribute engine's per-replica evaluation"], out
  assert all("compiles with XLA (jit_compile) and runs on a real batch" in p for p in passes)
  assert "TPUEstimator builds" not in out  # the estimator's TPU graph is not this engine's
  # The engine's model_fn calls: TPU params, per-replica batches (64 / 8, 128 / 8), a temp dir.
  calls = {(mode, batch, use_tpu, images) for mode, batch, use_tpu, images, _ in recorded}
  assert calls == {("train", 8, True, 8), ("eval", 16, True, 16)}, calls
  (temp_dir,) = {call[4] for call in recorded}
  assert temp_dir != str(model_dir) and not os.path.exists(temp_dir)
  assert not model_dir.exists()  # nothing written to --model_dir


def test_distribute_engine_names_the_op_tpus_cannot_run(digits_dir, tmp_path, capsys):
  status = _run(digits_dir, tmp_path, "--engine=distribute", "--model=tiny",
                "--train_batch_size=64", "--eval_batch_size=64",
                "--model_fn=preflight_models:rotating_model_fn")
  out = capsys.readouterr().out
  assert status == 1
  (failure,) = _op_failures(out, "ImageProjectiveTransformV3")
  assert failure.startswith("FAIL  distribute engine TRAIN step: TPUs cannot run "
                            "ImageProjectiveTransformV3 (node augment_rotation/transform/")
  assert "'augment_rotation/transform'" in failure  # the Keras layer's scope
  assert "preflight_models.py:" in failure  # the line that made it
  if stacks.HOST_XLA:  # The rotation runs in training only: the engine's EVAL step compiles.
    assert any(line.startswith("PASS  the distribute engine's per-replica evaluation step")
               for line in _lines(out, "PASS")), out
  assert out.splitlines()[-1].startswith("preflight: FAIL")


def test_auto_engine_is_checked_as_the_tpu_would_pick_it():
  config = tiny_config("/unused").replace("runtime", engine="auto")
  assert preflight.engine_of(config.replace("runtime", tpu_topology="v5litepod-8")) == (
      "distribute")
  assert preflight.engine_of(config.replace("runtime", tpu_topology="v3-8")) == "estimator"
  assert preflight.engine_of(config.replace("runtime", engine="distribute")) == "distribute"


def _tpu_lock_version():
  with open(os.path.join(REPO_DIR, "requirements", "tpu.lock")) as f:
    return next(line.split("==")[1].strip() for line in f
                if line.startswith(("tensorflow_tpu==", "tensorflow-tpu==")))


def test_the_op_table_is_the_tpu_builds_of_the_tpu_lock():
  version, table = tpu_checks.tpu_op_table()
  assert version == _tpu_lock_version()
  assert {"Conv2D", "MatMul", "CrossReplicaSum", "ResizeBilinear", "AssignVariableOp"} <= table
  assert not {"ImageProjectiveTransformV3", "DecodeJpeg", "IteratorGetNext"} & table
  if stacks.NAME == "tpu":  # the table is what scripts/make_tpu_op_table.py reads here, today
    spec = importlib.util.spec_from_file_location(
        "make_tpu_op_table", os.path.join(REPO_DIR, tpu_checks.TPU_OPS_SCRIPT))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert set(script.tpu_op_names()) == table


def test_an_op_outside_the_table_is_named_inside_functions_too():
  @tf.function(autograph=False)
  def rotate(images):
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=tf.constant([[1., 0., 0., 0., 1., 0., 0., 0.]]),
        output_shape=tf.constant([4, 4]), fill_value=0., interpolation="BILINEAR",
        name="spin")

  @tf.function(autograph=False)
  def scale(images):
    return tf.image.resize(images * 2.0, [8, 8])

  graph = tf.Graph()
  with graph.as_default():
    images = tf.compat.v1.placeholder(tf.float32, [1, 4, 4, 1])
    with tf.name_scope("model"):
      rotated = rotate(images)
    kept = scale(images)
  rotate_ops = [op for op in graph.get_operations() if op.name.startswith("model/")]
  (outside,) = tpu_checks.ops_outside_tpu_table(rotate_ops, graph)
  assert outside.op_type == "ImageProjectiveTransformV3"
  assert outside.node.endswith("/spin") and "rotate" in outside.node
  assert tpu_checks.ops_outside_tpu_table([kept.op], graph) == []
  del rotated


def test_the_verdict_is_the_tables_not_what_this_cpus_xla_compiles(digits_dir, tmp_path,
                                                                   monkeypatch):
  # A TensorFlow whose XLA for the CPU compiles an op TPUs lack (TF 2.23 and
  # ImageProjectiveTransformV3) must not turn the verdict: here Conv2D plays that op.
  version, table = tpu_checks.tpu_op_table()
  monkeypatch.setattr(tpu_checks, "tpu_op_table", lambda: (version, table - {"Conv2D"}))
  config = tiny_config(tmp_path, train_batch_size=64, eval_batch_size=64)
  train_fn = input_pipeline.make_input_fn(os.path.join(digits_dir, "train-*"), True,
                                          IMAGE_SIZE)
  findings = preflight.run_checks(config, model_fn_lib.model_fn, train_fn)
  failures = [f.message for f in findings if f.status == findings_lib.FAIL]
  conv = [m for m in failures if "TPUs cannot run Conv2D" in m]
  assert conv and all(m.startswith("TRAIN step: TPUs cannot run Conv2D (node ") for m in conv)
  assert all(f"TPU build of TensorFlow {version}" in m for m in conv)
  assert not any("compiles with XLA and runs" in f.message for f in findings)
