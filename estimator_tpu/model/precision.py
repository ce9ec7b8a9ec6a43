"""Mixed precision: what --precision computes in, its Keras policy, loss scaling, and host support.

Variables and their updates stay float32 whatever the precision, so a
checkpoint resumes in any precision and exports for any server; the
network's convolutions and matmuls compute in bfloat16 or float16 (Keras'
`mixed_bfloat16` / `mixed_float16` policies), and logits, losses and
metrics are float32. float16's narrow exponent range needs the loss scaled
up before the gradients and down after (dynamic loss scaling, TensorFlow's
`MixedPrecisionLossScaleOptimizer` around the TF 1 optimizer); bfloat16 has
float32's range and needs none.
"""

import logging
import platform

import tensorflow as tf

from estimator_tpu.model.precisions import BFLOAT16
from estimator_tpu.model.precisions import FLOAT16
from estimator_tpu.model.precisions import FLOAT32
from estimator_tpu.model.precisions import PRECISIONS

KERAS_POLICIES = {FLOAT32: "float32", BFLOAT16: "mixed_bfloat16", FLOAT16: "mixed_float16"}
# /proc/cpuinfo flags of CPUs whose oneDNN kernels compute bfloat16 natively:
# Intel AMX and AVX512-BF16 (x86), the BF16 extension (Arm v8.6+, "bf16").
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# Training steps in bfloat16 against float32 on a 2-core AMD EPYC (AVX2, no
# bfloat16 units), ResNet-50 at 224 px on the distribute engine
# (benchmarks/bench_train.py, medians of 5: 7.5x by images/s, 6.3x per CPU
# second; ResNet-18 at 64 px 2x): the figure the warning below states.
MEASURED_BF16_SLOWDOWN = "6-7x"

log = logging.getLogger("estimator_tpu")


def of_params(params):
  """The precision a model_fn's params ask for: 'precision', else 'use_bfloat16' (older params)."""
  precision = params.get("precision")
  if precision:
    return precision
  return BFLOAT16 if params.get("use_bfloat16") else FLOAT32


def keras_policy(precision):
  """The Keras dtype policy name of a precision: float32, mixed_bfloat16 or mixed_float16."""
  if precision not in KERAS_POLICIES:
    raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
  return KERAS_POLICIES[precision]


def compute_dtype(precision):
  """tf.float32, tf.bfloat16 or tf.float16: what the network's layers compute in."""
  keras_policy(precision)  # checks the name
  return tf.as_dtype(precision)


def loss_scaled(optimizer, precision):
  """`optimizer` with dynamic loss scaling for float16; as it is otherwise.

  Args:
    optimizer: a TF 1 optimizer (tf.compat.v1.train.Optimizer), possibly a
      CrossShardOptimizer.
    precision: one of PRECISIONS.

  Returns:
    A tf.compat.v1 optimizer. For float16 its minimize()/apply_gradients()
    skip the update of a step whose gradients are not finite and then halve
    the loss scale (2**15 at first, doubled after 2000 finite steps); the
    caller counts the global step itself (see train_op). The scale's
    variables are local variables, out of the checkpoint, so a checkpoint
    holds the same variables in every precision and resumes in any: each
    start (each train() call) begins at 2**15 again and finds its level
    within a few skipped steps.
  """
  if precision != FLOAT16:
    return optimizer
  with tf.compat.v1.variable_creator_scope(_as_local_variable):
    scale = tf.compat.v1.mixed_precision.DynamicLossScale()
  return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, scale)


def _as_local_variable(next_creator, **kwargs):
  kwargs["collections"] = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
  return next_creator(**kwargs)


def train_op(optimizer, loss, global_step, precision):
  """minimize(loss) that adds 1 to global_step on every step, skipped update or not.

  TensorFlow's loss-scale optimizer leaves the global step alone on a step
  it skips (gradients not finite); an estimator's step counts steps run, as
  Keras' loss-scale optimizer counts its iterations, so the step is added
  here, after the update.
  """
  if precision != FLOAT16:
    return optimizer.minimize(loss, global_step=global_step)
  update = optimizer.minimize(loss)
  with tf.control_dependencies([update]):
    return tf.compat.v1.assign_add(global_step, 1).op


def current_loss_scale(optimizer):
  """The loss scale `optimizer` multiplies the loss by now (float32 scalar), or None without one."""
  if not isinstance(optimizer, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer):
    return None
  return tf.cast(optimizer._loss_scale(), tf.float32)  # pylint: disable=protected-access


def cpu_flags(cpuinfo="/proc/cpuinfo"):
  """The CPU's feature flags as /proc/cpuinfo lists them (an empty set where there is none)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
          return set(value.split())
  except OSError:
    pass
  return set()


def cpu_computes_bfloat16(cpuinfo="/proc/cpuinfo"):
  """Whether this CPU has bfloat16 units (AMX, AVX512-BF16 or Arm BF16) that oneDNN uses."""
  return bool(cpu_flags(cpuinfo) & set(CPU_BF16_FLAGS))


def check_host(precision, use_tpu, num_gpus, cpuinfo="/proc/cpuinfo"):
  """Refuses or warns about a precision this host cannot compute well; returns the warning.

  Args:
    precision: one of PRECISIONS.
    use_tpu: the run trains on a TPU.
    num_gpus: the GPUs TensorFlow sees.
    cpuinfo: where the CPU's flags are read.

  Returns:
    The line logged (None when there was nothing to say).

  Raises:
    ValueError: float16 on a TPU, which computes bfloat16 only.
  """
  if precision == FLOAT16 and use_tpu:
    raise ValueError("--precision=float16 is not for TPUs, whose matrix units take bfloat16: "
                     "use --precision=bfloat16 there (float16 is for GPUs)")
  if precision == FLOAT32 or use_tpu or num_gpus:
    return None
  if precision == FLOAT16:
    line = ("--precision=float16 with no GPU: the CPU has no float16 units and emulates it, "
            "slower than float32 (float16 is for GPUs; use it here to check a run only)")
  elif cpu_computes_bfloat16(cpuinfo):
    return None
  else:
    machine = platform.machine() or "this machine"
    line = (f"--precision=bfloat16 on a CPU without bfloat16 units ({machine}: no AMX, "
            f"AVX512-BF16 or BF16 flag in {cpuinfo}) and no GPU or TPU: it is emulated, "
            f"measured {MEASURED_BF16_SLOWDOWN} slower than float32 for ResNet-50 training; "
            "--precision=float32 is faster here")
  log.warning(line)
  return line
