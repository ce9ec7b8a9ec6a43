"""Builds an accelerator check bundle on the host: the training step lowered for other machines.

A bundle is a directory a machine with JAX and NumPy alone can run
(runner/run.py, copied into it):

    manifest.json          the network, each precision's state and batch layout,
                           seeds, checksums, TensorFlow's losses, loss targets
    <network>_<precision>.jaxexport           the training step, jax.export'ed
    <network>_<precision>_highest.jaxexport   float32 for a GPU: the same step
                           with TensorFloat-32 off (the loss check's)
    run.py  plain_jax.py  regenerate.py       the runner
    _vendor/flatbuffers/   the host's flatbuffers, which jax.export needs to read
                           a step and jax does not install (Apache License 2.0)

Each step is one replica's training step of the JAX engine
(engines/jax/portable.py): TensorFlow's XLA bridge lowers the model_fn's
forward pass, gradients and optimizer update for every platform asked for,
and jax.export serializes them into one file. No weights or images are
shipped: the initial values and the batches are regenerated from seeds by
runner/regenerate.py's rule, here (assigned to TensorFlow's variables, then
TensorFlow runs the step itself for the reference losses) and on the
runner alike.

On a GPU, float32 convolutions and matrix products may compute in
TensorFloat-32 (TensorFlow's and JAX's default there). The speed step keeps
that default, as the plain JAX network the runner times it against does;
the loss check runs a second lowering with TensorFloat-32 off (TensorFlow's
bridge then asks XLA for full float32 precision), so that its losses can be
held to TensorFlow's CPU float32 run.
"""

import json
import os
import shutil
import tempfile

import jax
import numpy as np
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu.accelerator_check.runner import regenerate
from estimator_tpu.data import schema
from estimator_tpu.engines import choose
from estimator_tpu.engines.jax import lowering
from estimator_tpu.engines.jax import portable
from estimator_tpu.model import precisions

FORMAT = 1
MANIFEST = "manifest.json"
MAX_BYTES = 60 * 2 ** 20
RUNNER_FILES = ("run.py", "plain_jax.py", "regenerate.py")
VENDOR = "_vendor"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
# First step's loss, and each later one's, against TensorFlow's (absolute).
# bfloat16: TensorFlow's CPU kernels and another device's round differently
# at each layer (8-bit mantissas).
LOSS_TARGETS = {precisions.FLOAT32: (1e-4, 1e-2), precisions.BFLOAT16: (1e-2, 1e-1)}
# A randomly started ResNet-50 is chaotic: after the first update, TensorFlow
# against itself with the first batch's images moved by 1e-6 differs by up
# to 3e-2 in steps 2-5 (224 px, batch 64; 0.2 at 64 px, batch 16). The
# builder measures that spread (SPREAD_RUNS runs, images plus this much
# seeded noise) and the runner allows later steps SPREAD_FACTOR times it
# where that exceeds the target. bfloat16: half a rounding step of the images.
SPREAD_NOISE = {precisions.FLOAT32: 1e-6, precisions.BFLOAT16: 1e-3}
SPREAD_RUNS = 2
GPU_PLATFORMS = ("cuda", "rocm")
_LOWERING_NEEDS = ("bundles are built on the current or gpu stack, whose TensorFlow lowers for the "
                   "host CPU; TensorFlow's TPU build (the tpu stack) has no XLA for the CPU")


class BundleError(ValueError):
  """The bundle cannot be built as asked; the message names the value and what to do."""


def build(out_dir, network="resnet", resnet_depth=50, image_size=224, batch_size=64,
          num_classes=1000, precision_names=(precisions.FLOAT32, precisions.BFLOAT16),
          platforms=("cuda", "cpu"), steps=5, seed=0, batch_seed=1,
          base_learning_rate=config_lib.TrainConfig.base_learning_rate, log=print):
  """Writes a bundle to out_dir (made or emptied); returns its manifest.

  Args:
    out_dir: the bundle directory; an existing one must hold a bundle or
      nothing.
    network: the project's network (resnet, flowers, tiny).
    resnet_depth: ResNet's depth (18, 34, 50).
    image_size: the images' height and width.
    batch_size: one replica's (one device's) batch.
    num_classes: the label classes (the logits' width).
    precision_names: --precision values, a step for each.
    platforms: jax.export platforms (cpu, cuda, rocm, tpu).
    steps: the training steps TensorFlow runs for the reference losses.
    seed, batch_seed: regenerate.py's seeds of the state and the batches.
    base_learning_rate: --base_learning_rate (constant; times batch_size / 256).
    log: where progress lines go.

  Raises:
    BundleError: a bad value, a step TensorFlow cannot lower (an op with no
      XLA kernel; TensorFlow's TPU build, which lowers nothing for the host
      CPU), or a bundle over MAX_BYTES.
  """
  _check_args(out_dir, platforms, precision_names, steps)
  _empty(out_dir)
  manifest = {"format": FORMAT, "network_name": _network_name(network, resnet_depth),
              "platforms": list(platforms), "models": [],
              "built_with": f"tensorflow {tf.__version__}, jax {jax.__version__}"}
  for precision in precision_names:
    log(f"{precision}: tracing the {manifest['network_name']} step (batch {batch_size}, "
        f"{image_size} px) and lowering it for {', '.join(platforms)}")
    with tempfile.TemporaryDirectory() as model_dir:
      config = _config(network, resnet_depth, image_size, batch_size, num_classes, precision,
                       base_learning_rate, model_dir)
      manifest["models"].append(
          _model(config, precision, platforms, steps, seed, batch_seed, out_dir, log))
  for name in RUNNER_FILES:
    shutil.copy(os.path.join(os.path.dirname(regenerate.__file__), name), out_dir)
  _vendor_flatbuffers(out_dir)
  size = _bytes(out_dir)
  if size > MAX_BYTES:
    raise BundleError(f"the bundle in {out_dir} is {size / 2 ** 20:.1f} MiB, over "
                      f"{MAX_BYTES / 2 ** 20:.0f} MiB: ask for fewer --platforms or --precisions")
  # Last: a bundle without its manifest is not one (run.py says so).
  with open(os.path.join(out_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  manifest["bytes"] = _bytes(out_dir)
  return manifest


def _vendor_flatbuffers(out_dir):
  """Copies the host's flatbuffers package to out_dir/_vendor (run.py adds it after sys.path)."""
  import flatbuffers  # pylint: disable=import-outside-toplevel
  source = os.path.dirname(flatbuffers.__file__)
  target = os.path.join(out_dir, VENDOR, "flatbuffers")
  shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  with open(os.path.join(out_dir, VENDOR, "README"), "w") as f:
    f.write(f"flatbuffers {getattr(flatbuffers, '__version__', '')} (Apache License 2.0), copied "
            "from the host that built this bundle: jax.export reads steps with it and jax does "
            "not install it. run.py uses it only where Python has no flatbuffers of its own.\n")


def _bytes(directory):
  return sum(os.path.getsize(os.path.join(root, f))
             for root, _, files in os.walk(directory) for f in files)


def _check_args(out_dir, platforms, precision_names, steps):
  unknown = [p for p in platforms if p not in PLATFORMS]
  if unknown or not platforms:
    raise BundleError(f"--platforms={','.join(platforms)}: each one of {', '.join(PLATFORMS)}")
  wrong = [p for p in precision_names if p not in LOSS_TARGETS]
  if wrong or not precision_names:
    raise BundleError(f"--precisions={','.join(precision_names)}: each one of "
                      f"{', '.join(LOSS_TARGETS)}")
  if steps < 1:
    raise BundleError(f"--steps={steps}: TensorFlow's reference needs at least one step")
  if os.path.isdir(out_dir):
    extra = set(os.listdir(out_dir)) - {MANIFEST, VENDOR, *RUNNER_FILES}
    if any(not f.endswith(".jaxexport") for f in extra):
      raise BundleError(f"{out_dir} holds files that are not a bundle's ({sorted(extra)[:3]}): "
                        "give an empty or new directory")


def _empty(out_dir):
  os.makedirs(out_dir, exist_ok=True)
  for name in os.listdir(out_dir):
    path = os.path.join(out_dir, name)
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


def _network_name(network, resnet_depth):
  return f"resnet{resnet_depth}" if network == "resnet" else network


def _config(network, resnet_depth, image_size, batch_size, num_classes, precision,
            base_learning_rate, model_dir):
  """The run's Config: the project's defaults, a constant learning rate, no dropout, one device."""
  return (config_lib.Config()
          .replace("data", image_size=image_size, num_label_classes=num_classes,
                   class_names=tuple(str(i) for i in range(num_classes)),
                   num_eval_examples=batch_size, random_flip=False)
          .replace("model", model=network, resnet_depth=resnet_depth, dropout_rate=0.0,
                   precision=precision)
          .replace("train", train_batch_size=batch_size, eval_batch_size=batch_size,
                   base_learning_rate=base_learning_rate, lr_schedule="constant",
                   optimizer="momentum")
          .replace("runtime", engine="jax", strategy="one_device", iterations_per_loop=1,
                   model_dir=model_dir)
          .validate())


def _input_fn(image_size):
  """Batches of the step's shapes: {image: [batch, size, size, 3] float32}, labels [batch] int32."""

  def input_fn(params):
    example = ({schema.IMAGE_KEY: tf.zeros([image_size, image_size, 3])}, tf.zeros([], tf.int32))
    return tf.data.Dataset.from_tensors(example).repeat().batch(params["batch_size"],
                                                               drop_remainder=True)

  return input_fn


def _model(config, precision, platforms, steps, seed, batch_seed, out_dir, log):
  """One precision's manifest entry; writes its exported step(s) to out_dir."""
  try:
    engine = choose.build_estimator(config, config.data.class_names)
  except config_lib.ConfigError as e:  # a stack whose TensorFlow cannot lower for the host
    raise BundleError(f"{e} ({_LOWERING_NEEDS})") from None
  step = portable.PortableTrainStep(engine, _input_fn(config.data.image_size))
  state = state_entries(step.state_names, step.state_avals)
  batch = [_batch_entry(a, config.data.num_label_classes) for a in step.batch_avals]
  values = regenerate.initial_state(state, seed)
  data = [regenerate.batch(batch, s, batch_seed) for s in range(steps)]
  losses = _tf_losses(step, values, data)
  log(f"{precision}: TensorFlow's losses {', '.join(f'{v:.6f}' for v in losses)}")
  spread = np.zeros(len(losses))
  for run in range(SPREAD_RUNS):
    moved = _tf_losses(step, values, _nudged(data, SPREAD_NOISE[precision], batch_seed, run))
    spread = np.maximum(spread, np.abs(np.subtract(moved, losses)))
  log(f"{precision}: TensorFlow against itself with the images moved by "
      f"{SPREAD_NOISE[precision]:g}: {', '.join(f'{v:.2e}' for v in spread)}")
  name = f"{_network_name(config.model.model, config.model.resnet_depth)}_{precision}"
  exports = {"step": _export(step, platforms, out_dir, f"{name}.jaxexport", True)}
  exports["check"] = exports["step"]
  if precision == precisions.FLOAT32 and set(platforms) & set(GPU_PLATFORMS):
    exports["check"] = _export(step, platforms, out_dir, f"{name}_highest.jaxexport", False)
  params = config.to_params()
  return {
      "name": name, "precision": precision,
      "network": {"model": config.model.model, "resnet_depth": config.model.resnet_depth,
                  "image_size": config.data.image_size,
                  "num_classes": config.data.num_label_classes},
      "optimizer": {"learning_rate": params["base_learning_rate"] * config.train.train_batch_size
                    / 256, "momentum": params["momentum"], "nesterov": True,
                    "weight_decay": params["weight_decay"], "bn_momentum": 0.9,
                    "bn_epsilon": 1e-5},
      "seed": seed, "state": state, "state_checksum": regenerate.checksum(values),
      "batch_seed": batch_seed, "batch": batch,
      "batch_checksums": [regenerate.checksum(b) for b in data],
      "reference_losses": losses, "loss_targets": list(LOSS_TARGETS[precision]),
      "reference_spread": spread.tolist(), "spread_noise": SPREAD_NOISE[precision],
      "exports": exports}


def _tf_losses(step, values, data):
  """TensorFlow's losses of its own run of the step over data, from values."""
  step.set_tf_state(values)
  return [step.tf_step(b) for b in data]


def _nudged(data, noise, batch_seed, run):
  """data with the first batch's float entries plus `noise` times seeded standard normals."""
  first = [x + (noise * np.random.RandomState(regenerate.stream(batch_seed, 1_000_000, run, j))
                .standard_normal(x.shape)).astype(x.dtype)
           if np.issubdtype(x.dtype, np.floating) else x for j, x in enumerate(data[0])]
  return [first] + list(data[1:])


def _export(step, platforms, out_dir, file_name, tensor_float_32):
  """Writes step.fn exported for platforms (TensorFloat-32 on or off) to out_dir/file_name."""
  previous = tf.config.experimental.tensor_float_32_execution_enabled()
  tf.config.experimental.enable_tensor_float_32_execution(tensor_float_32)
  try:
    exported = jax.export.export(jax.jit(step.fn), platforms=list(platforms))(
        tuple(step.state_avals), list(step.batch_avals))
  except lowering.LoweringError as e:
    raise BundleError(f"{e} ({_LOWERING_NEEDS})") from None
  finally:
    tf.config.experimental.enable_tensor_float_32_execution(previous)
  with open(os.path.join(out_dir, file_name), "wb") as f:
    f.write(exported.serialize())
  return file_name


def state_entries(names, avals):
  """The manifest's state entries: each variable's name, shape, dtype, role and init."""
  entries = []
  for name, aval in zip(names, avals):
    role = role_of(name, names)
    if role == regenerate.KERNEL and len(aval.shape) < 2:
      role = regenerate.OTHER
    entries.append({"name": name, "shape": list(aval.shape), "dtype": np.dtype(aval.dtype).name,
                    "role": role, "init": regenerate.init_of(role)})
  return entries


def role_of(name, names):
  """A variable's role from its name: an optimizer's slot of another, the step, or its last part."""
  if any(name.startswith(other + "/") for other in names if other != name):
    return regenerate.SLOT
  if name == tf.compat.v1.GraphKeys.GLOBAL_STEP:
    return regenerate.STEP
  last = name.rsplit("/", 1)[-1]
  return last if last in regenerate.NETWORK_ROLES else regenerate.OTHER


def _batch_entry(aval, num_classes):
  dtype = np.dtype(aval.dtype)
  entry = {"shape": list(aval.shape), "dtype": dtype.name}
  if np.issubdtype(dtype, np.integer):
    return dict(entry, fill=regenerate.LABELS, high=num_classes)
  return dict(entry, fill=regenerate.NORMAL)
