"""build_estimator: the TPU branch checked on CPU (stand-in TPU system), and bfloat16."""

import logging
import os

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
from conftest import tiny_config
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.data import input_pipeline
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.model import model_fn as model_fn_lib
from estimator_tpu.model import precision
from estimator_tpu.tpu import checks

ModeKeys = stacks.ModeKeys
InputPipelineConfig = stacks.tpu.InputPipelineConfig


def _tpu_config(model_dir, **runtime):
  config = tiny_config(model_dir, train_batch_size=64, eval_batch_size=64)
  return config.replace("runtime", use_tpu=True, tpu="my-tpu", num_cores=8,
                        iterations_per_loop=3, **runtime).validate()


def _recording_model_fn(seen):
  """Our model_fn, remembering the params and image shape TPUEstimator gave it."""

  def model_fn(features, labels, mode, params):
    seen.update(params=dict(params), image_shape=features["image"].shape.as_list())
    return model_fn_lib.model_fn(features, labels, mode, params)

  return model_fn


def _train_input_fn(digits_dir):
  return input_pipeline.make_input_fn(os.path.join(digits_dir, "train-*"), True, IMAGE_SIZE,
                                      random_flip=False, seed=1)


def test_tpu_run_config_comes_from_the_flags_and_the_resolver(tmp_path):
  asked = []

  def resolver(runtime):
    asked.append(runtime.tpu)
    return checks.stand_in_resolver()

  estimator = estimator_lib.build_estimator(_tpu_config(tmp_path), resolver_fn=resolver)
  run_config = estimator.config
  assert asked == ["my-tpu"]
  assert run_config.master == checks.STAND_IN_MASTER
  assert run_config.tpu_config.iterations_per_loop == 3
  assert run_config.tpu_config.num_shards == 8
  assert run_config.tpu_config.per_host_input_for_training == InputPipelineConfig.PER_HOST_V2
  ctx = estimator._ctx
  assert (ctx._train_batch_size, ctx._eval_batch_size, ctx._predict_batch_size) == (64, 64, 64)
  assert estimator._export_to_tpu is False


def test_cpu_run_never_asks_for_a_tpu(tmp_path):
  def resolver(runtime):
    raise AssertionError(f"resolver called for {runtime}")

  estimator = estimator_lib.build_estimator(tiny_config(tmp_path), resolver_fn=resolver)
  assert estimator.config.master == "" and estimator.config.tpu_config.num_shards is None


def test_tpu_graph_gives_model_fn_per_core_batch_and_sums_gradients(tmp_path, digits_dir):
  seen = {}
  estimator = estimator_lib.build_estimator(
      _tpu_config(tmp_path), model_fn=_recording_model_fn(seen),
      resolver_fn=checks.stand_in_resolver)
  graph = checks.build_tpu_graph(estimator, _train_input_fn(digits_dir), ModeKeys.TRAIN, 8)

  params = seen["params"]
  assert params["use_tpu"] is True and params["batch_size"] == 8
  assert type(params["context"]).__name__ == "TPUContext"
  assert seen["image_shape"] == [8, IMAGE_SIZE, IMAGE_SIZE, 3]
  types = checks.graph_op_types(graph)
  assert {"CrossReplicaSum", "InfeedDequeueTuple", "OutfeedEnqueueTuple",
          "TPUReplicateMetadata"} <= types  # gradients summed; host_call outfed


def test_cpu_graph_has_global_batch_and_no_cross_replica_sum(tmp_path, digits_dir):
  seen = {}
  estimator = estimator_lib.build_estimator(tiny_config(tmp_path, train_batch_size=64),
                                            model_fn=_recording_model_fn(seen))
  graph = checks.build_tpu_graph(estimator, _train_input_fn(digits_dir), ModeKeys.TRAIN, 8)
  assert seen["params"]["use_tpu"] is False and seen["params"]["batch_size"] == 64
  assert "CrossReplicaSum" not in checks.graph_op_types(graph)


def test_tpu_eval_graph_builds_with_padded_input_and_metrics(tmp_path, digits_dir):
  seen = {}
  estimator = estimator_lib.build_estimator(
      _tpu_config(tmp_path), model_fn=_recording_model_fn(seen),
      resolver_fn=checks.stand_in_resolver)
  eval_fn = input_pipeline.make_input_fn(
      os.path.join(digits_dir, "validation-*"), False, IMAGE_SIZE,
      num_examples=NUM_EVAL, global_batch_size=64)
  graph = checks.build_tpu_graph(estimator, eval_fn, ModeKeys.EVAL, 8)
  assert seen["params"]["batch_size"] == 8
  assert "OutfeedEnqueueTuple" in checks.graph_op_types(graph)


def test_bfloat16_on_tpu_computes_in_bfloat16_keeps_float32_variables(tmp_path, digits_dir):
  estimator = estimator_lib.build_estimator(
      _tpu_config(tmp_path, use_bfloat16=True), resolver_fn=checks.stand_in_resolver)
  graph = checks.build_tpu_graph(estimator, _train_input_fn(digits_dir), ModeKeys.TRAIN, 8)
  convolutions = [node for function in graph.as_graph_def().library.function
                  for node in function.node_def if node.op == "Conv2D"]
  assert convolutions and all(node.attr["T"].type == tf.bfloat16.as_datatype_enum
                              for node in convolutions)
  with graph.as_default():
    assert {v.dtype.base_dtype for v in tf.compat.v1.global_variables()} <= {
        tf.float32, tf.int64}  # checkpoints stay loadable on CPU


def test_bfloat16_logits_are_cast_back_to_float32(tmp_path):
  params = dict(tiny_config(tmp_path).to_params(), use_tpu=True, use_bfloat16=True,
                batch_size=4)
  with tf.Graph().as_default():
    images = tf.zeros([4, IMAGE_SIZE, IMAGE_SIZE, 3])
    spec = model_fn_lib.model_fn({"image": images}, None, ModeKeys.PREDICT, params)
    assert spec.predictions["probabilities"].dtype == tf.float32


def test_bfloat16_off_tpu_computes_in_bfloat16_and_says_once_what_it_costs_here(
    tmp_path, caplog, digits_dir, monkeypatch):
  monkeypatch.setattr(precision, "cpu_computes_bfloat16", lambda cpuinfo=None: False)
  config = tiny_config(tmp_path).replace("model", precision="bfloat16").replace(
      "runtime", use_bfloat16=True)
  with caplog.at_level(logging.WARNING, logger="estimator_tpu"):
    estimator = estimator_lib.build_estimator(config)
  warnings = [r for r in caplog.records if "bfloat16" in r.getMessage()]
  assert len(warnings) == 1 and "without bfloat16 units" in warnings[0].getMessage()
  graph = checks.build_tpu_graph(estimator, _train_input_fn(digits_dir), ModeKeys.TRAIN, 8)
  assert [op for op in graph.get_operations() if op.type == "Conv2D"
          and op.outputs[0].dtype == tf.bfloat16]
