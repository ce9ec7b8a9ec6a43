"""Mixed precision in TF 1 programs on every engine: bfloat16_scope off TPU, float16 loss scale."""

import contract_programs
import pytest


@pytest.fixture(scope="module")
def scoped(tmp_path_factory):
  """bfloat16_scope.py on both engines, in bfloat16."""
  root = tmp_path_factory.mktemp("bfloat16_scope")
  return {"bfloat16": contract_programs.run_both("bfloat16_scope.py", root,
                                                 "--precision=bfloat16")}


def test_bfloat16_scope_computes_in_bfloat16_on_float32_variables(scoped):
  for engine, results in scoped["bfloat16"].items():
    assert results["computed"] == {"conv1": "bfloat16", "logits": "bfloat16"}, engine
    assert set(results["variable_dtypes"].values()) == {"float32", "int64"}, engine
    assert results["global_step"] == 6


def test_both_engines_train_the_same_model_in_bfloat16(scoped):
  estimator = scoped["bfloat16"]["estimator"]
  for engine in contract_programs.OTHERS:
    distribute = scoped["bfloat16"][engine]
    assert distribute["variable_dtypes"] == estimator["variable_dtypes"], engine
    assert distribute["loss"] == pytest.approx(estimator["loss"], rel=1e-3), engine
    assert distribute["accuracy"] == pytest.approx(estimator["accuracy"], abs=1e-6), engine
    assert distribute["classes"] == estimator["classes"] and len(estimator["classes"]) == 16


@pytest.mark.slow
def test_the_bfloat16_export_takes_and_returns_float32(scoped):
  for engine, results in scoped["bfloat16"].items():
    assert results["signature"] == {"inputs": {"image": "float32"},
                                    "outputs": {"classes": "int64", "probabilities": "float32"}
                                    }, engine


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
  return contract_programs.run_both("loss_scale.py", tmp_path_factory.mktemp("loss_scale"))


def test_the_loss_scale_halves_on_overflow_and_the_model_then_trains(scaled):
  for engine, results in scaled.items():
    stops = results["stops"]
    assert [s["global_step"] for s in stops] == [1, 3, 12], engine
    scales = [s["loss_scale"] for s in stops]
    # 2**15 overflows the float16 gradients: each such step is skipped and halves the scale.
    assert scales[0] == 2.0 ** 14 and scales[0] > scales[1] > scales[2], (engine, scales)
    assert not stops[0]["kernel_changed"] and stops[2]["kernel_changed"], engine
    assert all(s["kernel_finite"] for s in stops), engine
    assert results["computed"] == {"hidden": "float16"}, engine
    assert set(results["variable_dtypes"].values()) == {"float32", "int64"}, engine


def test_both_engines_scale_the_loss_alike(scaled):
  for engine in contract_programs.OTHERS:
    assert scaled[engine]["stops"] == scaled["estimator"]["stops"], engine
    # The optimizer's slots keep their estimator names though made in the update's cond.
    assert scaled[engine]["variable_dtypes"] == scaled["estimator"]["variable_dtypes"], engine
