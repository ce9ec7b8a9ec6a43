"""python -m estimator_tpu.compat check / tables: legacy sources read, never run."""

import os
import subprocess
import sys
import textwrap

from conftest import program_env
import pytest

from estimator_tpu.compat import __main__ as compat_main
from estimator_tpu.compat import check
from estimator_tpu.compat import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = textwrap.dedent("""\
    import tensorflow as tf
    import tensorflow.compat.v1 as tf1
    from tensorflow.contrib import tpu as contrib_tpu
    from tensorflow.contrib.tpu.python.tpu import async_checkpoint
    from tensorflow.contrib import slim
    from tensorflow.python.estimator import estimator
    import tensorflow.contrib.lookup as lookup

    def model_fn(features):
      hidden = tf.layers.dense(features, 4)
      width = hidden.shape[-1].value
      hook = async_checkpoint.AsyncCheckpointSaverHook("dir", save_steps=1)
      opt = contrib_tpu.CrossShardOptimizer(tf1.train.AdamOptimizer())
      table = lookup.index_table_from_tensor(["a"])
      tf.contrib.layers.embed_sequence(hidden, 2)
      tf.contrib.no_such_module.thing()
      tf.not_a_v1_name(1)
      tf.train.Optimizer.__init__
      return estimator.Estimator, tf.contrib.tpu.TPUEstimator.export_savedmodel
    """)


def _check(tmp_path, source, name="program.py"):
  path = tmp_path / name
  path.write_text(source)
  lines = []
  status = check.main([str(path)], out=lines.append)
  prefix = f"{path}:"
  return status, [line[len(prefix):] for line in lines if line.startswith(prefix)], lines


def test_every_name_through_every_alias_with_its_status(tmp_path):
  status, uses, lines = _check(tmp_path, PROGRAM)
  assert status == 1
  assert uses == [
      "3: tensorflow.contrib.tpu  mapped",
      "4: tensorflow.contrib.tpu.python.tpu.async_checkpoint  mapped",
      "5: tensorflow.contrib.slim  mapped",
      "6: tensorflow.python.estimator.estimator  mapped",
      "7: tensorflow.contrib.lookup  mapped",
      "10: tf.layers.dense  mapped",
      "12: tensorflow.contrib.tpu.python.tpu.async_checkpoint.AsyncCheckpointSaverHook  "
      "re-implemented  (estimator_tpu.compat.checkpoint_hooks.AsyncCheckpointSaverHook)",
      "13: tensorflow.contrib.tpu.CrossShardOptimizer  re-implemented  "
      "(estimator_tpu.compat.tpu.CrossShardOptimizer)",
      "13: tf.train.AdamOptimizer  mapped",
      "14: tensorflow.contrib.lookup.index_table_from_tensor  re-implemented  "
      "(estimator_tpu.compat.lookup.index_table_from_tensor)",
      "15: tf.contrib.layers.embed_sequence  refused  instead: "
      + registry.LAYERS["embed_sequence"].note,
      "16: tf.contrib.no_such_module.thing  unknown  (see docs/MIGRATING.md)",
      "17: tf.not_a_v1_name  unknown  (not in tf.compat.v1 of TF "
      + __import__("tensorflow").__version__ + ")",
      "18: tf.train.Optimizer  mapped",  # up to the first dunder
      "19: tensorflow.python.estimator.estimator.Estimator  mapped",
      "19: tf.contrib.tpu.TPUEstimator.export_savedmodel  mapped",
      " 16 TF names (10 mapped, 3 re-implemented, 1 refused, 2 unknown, 0 adapted), TF 1 code "
      "(for `from estimator_tpu.compat import tf`): needs changes before it runs",
  ]
  assert len(lines) == len(uses)


def test_the_compat_import_is_an_alias_too_and_a_clean_file_exits_0(tmp_path):
  source = ("from estimator_tpu.compat import tf as compat\n"
            "compat.contrib.training.checkpoints_iterator('d')\n"
            "compat.Dimension(3).value\n")
  status, uses, _ = _check(tmp_path, source)
  assert status == 0
  assert uses == ["2: tf.contrib.training.checkpoints_iterator  mapped",
                  "3: tf.Dimension  mapped",
                  " 2 TF names (2 mapped, 0 re-implemented, 0 refused, 0 unknown, 0 adapted), "
                  "TF 1 code (for `from estimator_tpu.compat import tf`): runs with only its "
                  "import line changed"]


TF2_PROGRAM = textwrap.dedent("""\
    import tensorflow as tf

    def build(columns, model_dir):
      estimator = tf.estimator.DNNClassifier(
          hidden_units=[8], feature_columns=columns, model_dir=model_dir,
          optimizer=tf.keras.optimizers.legacy.Adagrad(0.1))
      spec = tf.feature_column.make_parse_example_spec(columns)
      return estimator, tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)

    def serve(path):
      return tf.saved_model.load(path).signatures["predict"]
    """)


def test_a_tf_2_program_is_checked_against_the_tf2_entry_point(tmp_path):
  status, uses, _ = _check(tmp_path, TF2_PROGRAM)
  assert status == 0
  assert uses[-1] == (" 5 TF names (5 mapped, 0 re-implemented, 0 refused, 0 unknown, 0 adapted), "
                      "a TF 2 program (for `from estimator_tpu.compat import tf2 as tf`): runs "
                      "with only its import line changed")
  # A name only TF 1 had makes it TF 1 code, checked as such.
  status, uses, _ = _check(tmp_path, TF2_PROGRAM + "x = tf.placeholder(tf.float32)\n")
  assert uses[-1].endswith("TF 1 code (for `from estimator_tpu.compat import tf`): runs with "
                           "only its import line changed"), uses[-1]
  # The estimator's boosted trees are gone on every stack: refused, with what to use instead.
  status, uses, _ = _check(tmp_path, "from estimator_tpu.compat import tf2 as tf\n"
                                     "tf.estimator.BoostedTreesClassifier\n")
  assert status == 1
  assert uses[0].startswith("2: tf.estimator.BoostedTreesClassifier  refused  instead: ")
  assert "TensorFlow Decision Forests" in uses[0]


def test_real_modules_subclass_hooks_and_flagged_branches_are_told_as_they_are(tmp_path):
  source = textwrap.dedent("""\
      import tensorflow as tf
      from tensorflow.core.protobuf import rewriter_config_pb2
      from tensorflow.contrib.tpu.python.tpu import tpu_function

      class CrossReplicaBatchNorm(tf.layers.BatchNormalization):
        def _moments(self, inputs, reduction_axes, keep_dims):
          return tpu_function.get_tpu_context()

      class Padded(tf.keras.layers.Conv1D):
        def _compute_causal_padding(self):
          return [[0, 0], [2, 0], [0, 0]]

      def reader(use_bigtable):
        if use_bigtable:
          return tf.contrib.cloud.BigtableClient("project", "instance")
        return tf.data.TFRecordDataset("train.tfrecord")
      """)
  status, uses, _ = _check(tmp_path, source)
  assert status == 0  # the refused name sits behind a flag
  assert "2: tensorflow.core.protobuf.rewriter_config_pb2  mapped" in uses
  assert "3: tensorflow.contrib.tpu.python.tpu.tpu_function  mapped" in uses
  assert ("6: CrossReplicaBatchNorm._moments (tf.layers.BatchNormalization)  adapted  (TF 1 "
          "signature; Keras now passes mask=, which estimator_tpu.compat drops for it "
          "(layer_hooks))") in uses
  assert any(use.startswith("10: Padded._compute_causal_padding (tf.keras.layers.Conv1D)  "
                            "adapted  (TF 1 signature; Keras now passes inputs,") for use in uses)
  assert ("15: tf.contrib.cloud.BigtableClient  refused  instead: "
          + registry.REFUSED_MODULES["cloud"].note + "  [only under `if use_bigtable`]") in uses
  assert uses[-1].endswith("runs with only its import line changed as long as it takes no "
                           "branch under `use_bigtable` (line 15)"), uses[-1]


def test_files_that_cannot_be_read_are_named(tmp_path):
  status, uses, lines = _check(tmp_path, "def broken(:\n", name="broken.py")
  assert status == 1 and uses == ["1: cannot parse: invalid syntax"]
  missing = str(tmp_path / "missing.py")
  lines = []
  assert check.main([missing], out=lines.append) == 1
  assert lines == [f"{missing}: cannot read: No such file or directory"]


def _module(*args):
  return subprocess.run([sys.executable, "-m", "estimator_tpu.compat", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=120,
                        env=program_env(TF_CPP_MIN_LOG_LEVEL="3"))


def test_no_command_is_a_short_usage_and_exit_2_tables_prints_the_tables():
  plain, tables = _module(), _module("tables")
  assert plain.returncode == 2 and plain.stdout == ""
  assert len(plain.stderr.splitlines()) <= 3, plain.stderr
  assert plain.stderr.startswith("usage: python -m estimator_tpu.compat [-h] {check,tables}")
  assert "error: name a command: check PROGRAM.py" in plain.stderr
  assert tables.returncode == 0
  assert tables.stdout == registry.markdown_tables() + "\n"


def test_check_command_exit_status_and_usage_errors(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("import tensorflow as tf\ntf.contrib.learn.Experiment\n")
  done = _module("check", str(bad))
  assert done.returncode == 1
  assert f"{bad}:2: tf.contrib.learn.Experiment  refused  instead: tf.contrib.learn" in done.stdout
  usage = _module("check")
  assert usage.returncode == 2 and "PROGRAM.py" in usage.stderr
  with pytest.raises(SystemExit):
    compat_main.parse_args(["lint"])
