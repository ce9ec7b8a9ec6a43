"""The accelerator check: a bundle built with TensorFlow runs on JAX and NumPy alone."""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

from conftest import program_env
import numpy as np
import pytest

# The check is JAX's: a stack whose lock has no jax (tf2.15, Python 3.11; jax >= 0.11.2
# needs 3.12) has nothing of it to test.
pytest.importorskip("jax", reason="the accelerator check needs jax, not in this stack's lock")

from estimator_tpu.accelerator_check import bundle  # noqa: E402
from estimator_tpu.accelerator_check.runner import regenerate  # noqa: E402

STEPS = 3
# TensorFlow's TPU build (the tpu stack) has no XLA for the host CPU: it lowers no JAX engine step.
try:
  importlib.metadata.version("tensorflow-tpu")
  TPU_BUILD = True
except importlib.metadata.PackageNotFoundError:
  TPU_BUILD = False
needs_host_xla = pytest.mark.skipif(
    TPU_BUILD, reason="TensorFlow's TPU build lowers nothing for the host CPU: "
    "test_the_tpu_build_refuses_to_build_a_bundle checks that instead")
# run.py as a process where TensorFlow and the project cannot be imported: `python -I` (no
# PYTHONPATH, no user site, not the working directory) and both names blocked in sys.modules.
NO_TENSORFLOW = """
import runpy, sys
for name in ("tensorflow", "tf_keras", "estimator_tpu"):
  sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_bundle(bundle_dir, *args):
  return subprocess.run(
      [sys.executable, "-I", "-c", NO_TENSORFLOW, os.path.join(bundle_dir, "run.py"), *args],
      cwd=os.path.dirname(bundle_dir), env=program_env(JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny_bundle(tmp_path_factory):
  """A cpu bundle of the tiny network, float32 and bfloat16, moved away from where it was built."""
  built = str(tmp_path_factory.mktemp("built") / "bundle")
  manifest = bundle.build(built, network="tiny", image_size=16, batch_size=4, num_classes=10,
                          platforms=("cpu",), steps=STEPS, log=lambda line: None)
  moved = str(tmp_path_factory.mktemp("elsewhere") / "bundle")
  shutil.copytree(built, moved)
  return moved, manifest


@pytest.mark.slow
@needs_host_xla
def test_runner_gives_tensorflows_losses_without_tensorflow(tiny_bundle):
  bundle_dir, manifest = tiny_bundle
  done = run_bundle(bundle_dir, "--steps=2", "--warmup=1", "--repeats=5")
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["platform"] == "cpu" and result["network"] == "tiny" and result["batch_size"] == 4
  for model in manifest["models"]:
    losses = result["losses"][model["precision"]]
    assert losses["tf"] == model["reference_losses"] and len(losses["ours"]) == STEPS
    first, rest = losses["targets"]
    assert losses["abs_diff"][0] <= first and max(losses["abs_diff"][1:]) <= rest
    assert losses["targets_met"] and losses["pass"]
    assert losses["tf_spread"] == model["reference_spread"] and losses["allowed"][0] == first
    # The plain JAX network, from the same values, is the same computation.
    assert losses["plain_same_init"]
    assert losses["plain_first_loss_diff"] < (1e-5 if model["precision"] == "float32" else 2e-2)
  assert abs(result["losses"]["float32"]["abs_diff"][0]) < 1e-5
  assert set(result["images_per_s"]) == {"float32", "bfloat16"}
  for precision, speed in result["images_per_s"].items():
    assert speed["ours"] > 0 and speed["plain_jax"] > 0
    assert result["ratio_by_precision"][precision] == pytest.approx(
        speed["ours"] / speed["plain_jax"])
  assert result["ratio"] == min(result["ratio_by_precision"].values())
  assert result["losses_pass"] is True


@needs_host_xla
def test_bundle_holds_steps_seeds_and_references_not_values(tiny_bundle):
  bundle_dir, manifest = tiny_bundle
  files = sorted(os.listdir(bundle_dir))
  assert files == ["_vendor", "manifest.json", "plain_jax.py", "regenerate.py", "run.py",
                   "tiny_bfloat16.jaxexport", "tiny_float32.jaxexport"]
  assert os.path.isfile(os.path.join(bundle_dir, "_vendor", "flatbuffers", "builder.py"))
  assert manifest["bytes"] == sum(os.path.getsize(os.path.join(root, f))
                                  for root, _, names in os.walk(bundle_dir) for f in names)
  assert manifest["bytes"] < 500_000
  model = manifest["models"][0]
  assert [len(model["reference_losses"]), model["loss_targets"]] == [STEPS, [1e-4, 1e-2]]
  # TensorFlow against itself with the images moved by 1e-6: the first step barely moves.
  assert len(model["reference_spread"]) == STEPS and model["spread_noise"] == 1e-6
  assert 0 <= model["reference_spread"][0] < 1e-4
  roles = {e["name"].rsplit("/", 1)[-1] if e["role"] != "slot" else "slot": (e["role"], e["init"])
           for e in model["state"]}
  assert roles["kernel"] == ("kernel", "fan_in_normal")
  assert roles["gamma"] == ("gamma", "ones") and roles["moving_variance"] == (
      "moving_variance", "ones")
  assert roles["slot"] == ("slot", "zeros") and roles["global_step"] == ("step", "zeros")
  values = regenerate.initial_state(model["state"], model["seed"])
  kernel = values[[e["role"] for e in model["state"]].index("kernel")]
  assert kernel.shape == (3, 3, 3, 8)
  assert np.std(kernel) == pytest.approx(np.sqrt(2 / 27), rel=0.3)
  assert regenerate.mismatches(values, model["state_checksum"],
                               [e["name"] for e in model["state"]]) == []
  images, labels = regenerate.batch(model["batch"], 0, model["batch_seed"])
  assert images.shape == (4, 16, 16, 3) and labels.dtype == np.int32
  assert 0 <= labels.min() and labels.max() < 10


def edited_copy(bundle_dir, tmp_path, edit):
  """A copy of bundle_dir whose manifest edit(manifest) changed."""
  copy = str(tmp_path / "bundle")
  shutil.copytree(bundle_dir, copy)
  path = os.path.join(copy, "manifest.json")
  with open(path) as f:
    manifest = json.load(f)
  edit(manifest)
  with open(path, "w") as f:
    json.dump(manifest, f)
  return copy


@needs_host_xla
def test_a_first_loss_off_by_more_than_its_target_fails(tiny_bundle, tmp_path):
  def edit(manifest):
    manifest["models"][0]["reference_losses"][0] += 3e-4
  done = run_bundle(edited_copy(tiny_bundle[0], tmp_path, edit), "--no_speed",
                    "--precisions=float32")
  assert done.returncode == 1, done.stderr[-2000:]
  losses = json.loads(done.stdout.strip().splitlines()[-1])["losses"]["float32"]
  assert losses["abs_diff"][0] == pytest.approx(3e-4, abs=1e-5)
  assert not losses["pass"] and not losses["targets_met"]
  assert "float32 losses:" in done.stdout and ": FAIL" in done.stdout


@needs_host_xla
def test_runner_refuses_values_that_are_not_the_hosts(tiny_bundle, tmp_path):
  def edit(manifest):
    manifest["models"][0]["seed"] += 1
  done = run_bundle(edited_copy(tiny_bundle[0], tmp_path, edit), "--no_speed")
  assert done.returncode == 2
  assert "regenerated initial values differ from the host's: tiny/conv_bn/conv2d/kernel" in (
      done.stderr)


def test_roles_come_from_names():
  names = ["net/conv/kernel", "net/bn/gamma", "net/bn/moving_mean", "net/head/bias",
           "global_step", "net/conv/kernel/Momentum", "net/counter"]
  assert [bundle.role_of(n, names) for n in names] == [
      "kernel", "gamma", "moving_mean", "bias", "step", "slot", "other"]


def test_bad_requests_are_refused_before_anything_is_written(tmp_path):
  with pytest.raises(bundle.BundleError, match="--platforms=gpu: each one of cpu, cuda, rocm, tpu"):
    bundle.build(str(tmp_path / "a"), platforms=("gpu",))
  with pytest.raises(bundle.BundleError, match="--precisions=float16"):
    bundle.build(str(tmp_path / "a"), precision_names=("float16",))
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "notes.txt").write_text("mine")
  with pytest.raises(bundle.BundleError, match="holds files that are not a bundle's"):
    bundle.build(str(tmp_path / "b"), platforms=("cpu",))
  assert os.listdir(tmp_path / "b") == ["notes.txt"]
  assert not (tmp_path / "a").exists()


# Compiling a ResNet's step takes 20-30 s on 2 cores: those run with the end-to-end tests.
@pytest.mark.parametrize("network", [
    pytest.param({"model": "resnet", "resnet_depth": 18, "image_size": 32, "num_classes": 10},
                 id="resnet18", marks=pytest.mark.slow),
    pytest.param({"model": "resnet", "resnet_depth": 50, "image_size": 32, "num_classes": 10},
                 id="resnet50", marks=pytest.mark.slow),
    pytest.param({"model": "flowers", "resnet_depth": 50, "image_size": 32, "num_classes": 10},
                 id="flowers"),
    pytest.param({"model": "tiny", "resnet_depth": 50, "image_size": 32, "num_classes": 10},
                 id="tiny")])
def test_plain_jax_networks_train_a_step(network, monkeypatch):
  monkeypatch.syspath_prepend(os.path.dirname(regenerate.__file__))  # as run.py has it
  import jax
  import plain_jax
  layout = plain_jax.layout(network, (2, 32, 32, 3))
  kernels = [shape for role, shape in layout if role == "kernel"]
  # Each conv and the dense head: ResNet-50 has 53 convolutions, ResNet-18 20, flowers 2 per block.
  assert len(kernels) == {"resnet18": 21, "resnet50": 54, "flowers": 7, "tiny": 2}[
      network["model"] + (str(network["resnet_depth"]) if network["model"] == "resnet" else "")]
  assert kernels[-1] == (layout[-2][1][0], 10) and layout[-1] == ("bias", (10,))
  entries = [{"name": str(i), "shape": shape, "dtype": "float32", "init": regenerate.init_of(role)}
             for i, (role, shape) in enumerate(layout)]
  model = {"network": network, "precision": "float32",
           "batch": [{"shape": [2, 32, 32, 3]}, {"shape": [2]}],
           "optimizer": {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True,
                         "weight_decay": 1e-4, "bn_momentum": 0.9, "bn_epsilon": 1e-5}}
  step = plain_jax.PlainStep(model, regenerate.initial_state(entries, 0))
  images = np.random.RandomState(0).standard_normal((2, 32, 32, 3)).astype(np.float32)
  (values, slots, count), loss = jax.jit(step.step)(step.state, [images, np.array([1, 2])])
  assert np.isfinite(float(loss)) and int(count) == 1
  assert [v.shape for v in values] == [shape for _, shape in layout]
  assert len(slots) == sum(role in ("kernel", "gamma", "beta", "bias") for role, _ in layout)
  assert not np.allclose(values[0], step.state[0][0])  # the first kernel moved


@pytest.mark.skipif(not TPU_BUILD, reason="for TensorFlow's TPU build (the tpu stack)")
def test_the_tpu_build_refuses_to_build_a_bundle(tmp_path):
  out = str(tmp_path / "bundle")
  with pytest.raises(bundle.BundleError) as refused:
    bundle.build(out, network="tiny", image_size=16, batch_size=4, num_classes=10,
                 precision_names=("float32",), platforms=("tpu",), steps=1, log=lambda line: None)
  message = str(refused.value)
  assert "needs TensorFlow's XLA bridge for the host" in message
  assert "built on the current or gpu stack" in message
  assert not os.path.exists(os.path.join(out, "manifest.json"))
