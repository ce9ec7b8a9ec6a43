"""A TensorFlow step as a JAX function: TensorFlow's XLA bridge lowers it, JAX compiles and runs it.

`jax.experimental.jax2tf.call_tf` does this for pure TensorFlow functions;
a model_fn's step is not pure: it reads and updates the program's
variables. TensorFlow's XLA bridge already turns such a function into a
pure one -- the variables it captures become parameters of the lowered
computation after the function's own arguments, and its results come
first in the computation's results (the variables' updated values follow) --
so a step that returns every variable's value after its update is, lowered,
a function of explicit state: `(args..., variables...) -> (results...)`.

`LoweredStep` holds such a step; `LoweredStep.bind` is the JAX function. Its
primitive lowers, on each platform JAX lowers for (cpu, cuda, rocm, tpu), to
the computation TensorFlow's XLA bridge gives for that platform, called from
JAX's module, as call_tf does; `jax.export` serializes it like any JAX
function.
"""

import contextlib
import functools
import re

import jax
from jax.extend import core as jax_core
from jax.extend import mlir as jax_mlir
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func as func_dialect
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import mlir
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import wrap_function
from tensorflow.python.framework import config as tf_config
from tensorflow.python.util import object_identity

# TensorFlow's name for each platform JAX lowers for.
TF_PLATFORMS = {"cpu": "CPU", "cuda": "GPU", "rocm": "GPU", "tpu": "TPU"}

_step_p = jax_core.Primitive("tensorflow_step")
_step_p.multiple_results = True


# TensorFlow's refusal to lower a step that captures variables for a platform it has no device of.
_NO_DEVICE = "does not support resource arguments when device is null"


class _NoDevice(Exception):
  pass


class LoweringError(ValueError):
  """TensorFlow's XLA bridge cannot lower the step (an op with no XLA kernel, a dynamic shape)."""


class LoweredStep:
  """A step of explicit arguments that reads and updates captured variables, for JAX.

  The step is traced once; what its results and its stateful ops do not need
  (a class-name lookup the host makes instead, say) is pruned away, as
  TensorFlow's runtime prunes a function before it runs it, so that
  TensorFlow's XLA bridge compiles only that.

  Args:
    python_fn: (*flat args) -> a flat list of tensors; the variables it
      reads are made outside it (captured).
    arg_specs: the tf.TensorSpecs it is traced for (a flat list).
    name: a name for the lowered computation (error messages, the module).
    known_variables: variables it may capture besides those its trace lists
      (made outside it by the caller).

  Attributes:
    variables: the captured tf.Variables, in the order the lowered
      computation takes their values (after the arguments).
    out_avals: jax.core.ShapedArrays of the function's flat results.
  """

  def __init__(self, python_fn, arg_specs, name, known_variables=()):
    self.name = name
    self._arg_specs = list(arg_specs)
    self._function = _pruned_for_xla(python_fn, self._arg_specs)
    self.concrete = self._function.get_concrete_function(*self._arg_specs)
    self.variables, self._constants = _captures(self.concrete, known_variables, name)
    self.out_avals = tuple(_aval(t.shape, t.dtype, f"result {i} of {name}")
                           for i, t in enumerate(self.concrete.outputs))
    self._hlo = {}

  def hlo(self, tf_platform):
    """The serialized HloModule TensorFlow's XLA bridge lowers the step to, for tf_platform.

    One per platform and TensorFloat-32 setting: with TensorFloat-32 off
    (tf.config.experimental.enable_tensor_float_32_execution(False)) the
    bridge asks for full float32 precision in convolutions and matrix products.

    The bridge lowers a step that captures variables only for a platform
    TensorFlow has a device of ("GetCompilerIr does not support resource
    arguments when device is null"): where it has none (a GPU or TPU that
    JAX drives and TensorFlow does not see) the step is the host CPU's
    lowering, as long as it holds no CPU custom call. The bridge's kernels
    are the same for every device: a training step of convolutions, batch
    norm, pooling, dense layers, softmax cross-entropy and momentum lowers
    to the same HLO for CPU, GPU (TF 2.21) and TPU (TF 2.20's TPU build),
    in float32 and bfloat16 (docs/TPU_AND_GPUS.md).
    """
    key = (tf_platform, tf.config.experimental.tensor_float_32_execution_enabled())
    if key not in self._hlo:
      try:
        self._hlo[key] = self._compiler_ir(tf_platform)
      except _NoDevice:
        self._hlo[key] = self._host_lowering_for(tf_platform)
    return self._hlo[key]

  def _compiler_ir(self, tf_platform):
    try:
      with _tensorflows_determinism_off():
        return self._function.experimental_get_compiler_ir(*self._arg_specs)(
            stage="hlo_serialized", platform_name=tf_platform)
    except (tf.errors.OpError, ValueError) as e:
      if tf_platform != "CPU" and _NO_DEVICE in str(e):
        raise _NoDevice() from None
      raise LoweringError(unlowerable_message(str(e), self.name, tf_platform)) from None

  def _host_lowering_for(self, tf_platform):
    try:
      hlo = self.hlo("CPU")
    except LoweringError as e:
      raise LoweringError(f"{e} (TensorFlow has no {tf_platform} device here, so the step is "
                          "lowered for the host CPU)") from None
    if b"custom-call" in hlo:
      raise LoweringError(
          f"the {self.name} lowers for the host CPU with a custom call, which runs on the CPU "
          f"only, and TensorFlow has no {tf_platform} device here to lower it for {tf_platform}")
    return hlo

  def bind(self, variables, *args):
    """The step's flat results, as JAX values: variables (in self.variables' order), then args."""
    return _step_p.bind(*args, *variables, step=self)

  # A primitive's parameters are hashed: a step is itself, whatever it holds.
  __hash__ = object.__hash__
  __eq__ = object.__eq__


@contextlib.contextmanager
def _tensorflows_determinism_off():
  """TensorFlow's op determinism off while its bridge lowers a step JAX runs.

  Under --deterministic TensorFlow's bridge refuses ops whose TensorFlow
  kernels have no deterministic form (a GPU MaxPool gradient) even when it
  lowers them for JAX, which runs what it compiles the same way each time
  (XLA's CPU and TPU compile deterministic programs; on GPUs the engine sets
  XLA's --xla_gpu_deterministic_ops).
  """
  was_on = tf_config.is_op_determinism_enabled()
  if was_on:
    tf_config.disable_op_determinism()
  try:
    yield
  finally:
    if was_on:
      tf.config.experimental.enable_op_determinism()


def _pruned_for_xla(python_fn, arg_specs):
  """python_fn as a jit_compile tf.function of only what its results and stateful ops need."""
  traced = tf.function(python_fn, autograph=False).get_concrete_function(*arg_specs)
  graph = traced.graph
  captured = object_identity.ObjectIdentitySet(graph.internal_captures)
  feeds = [t for t in graph.inputs if t not in captured]
  wrapped = wrap_function.WrappedFunction(graph, wrap_function.VariableHolder())
  num_outputs = len(graph.outputs)
  pruned = wrapped.prune(feeds=feeds, fetches=list(graph.outputs) + list(graph.control_outputs))

  def step(*args):
    return pruned(*args)[:num_outputs]

  return tf.function(step, autograph=False, jit_compile=True)


def _captures(concrete, known_variables, name):
  """(the captured variables in capture order, {capture index: constant value} of the rest)."""
  by_handle = {id(v.handle): v for v in [*known_variables, *concrete.variables]}
  variables, constants = [], {}
  for i, captured in enumerate(concrete.captured_inputs):
    if captured.dtype == tf.resource:
      variable = by_handle.get(id(captured))
      if variable is None:
        kind = re.search(r'type="([^"]+)"', str(captured))
        raise LoweringError(
            f"the {name} uses a TensorFlow resource that is not a variable "
            f"({kind.group(1) if kind else captured}): a lookup table, iterator or summary "
            "writer cannot be state of a JAX step; use it in the input_fn or a host_call (as "
            "on a TPU), or run with --engine=distribute")
      variables.append(variable)
    else:
      constants[i] = np.asarray(captured)
  return variables, constants


def _aval(shape, dtype, what):
  if not shape.is_fully_defined():
    raise LoweringError(f"{what} has the shape {shape}: a JAX step needs static shapes "
                        "(batch with drop_remainder=True)")
  if dtype == tf.string:
    raise LoweringError(f"{what} is a string tensor: JAX has no strings; decode it in the input_fn")
  return jax.core.ShapedArray(tuple(shape.as_list()), jax.dtypes.canonicalize_dtype(
      dtype.as_numpy_dtype))


def unlowerable_message(error, step_name, tf_platform):
  """One line from TensorFlow's refusal: the op, where the model_fn made it, what to do."""
  found = re.search(r"Detected unsupported operations when trying to compile graph .*? on "
                    r"(\S+): (\w+) \(No registered '(\w+)' OpKernel", error)
  if found:
    device, _, op = found.groups()
    node = re.search(r"\{\{node ([^}]+)\}\}", error)
    where = f" (node {node.group(1)!r})" if node else ""
    return (f"the {step_name} uses the op {op}{where}, which TensorFlow's XLA bridge cannot lower "
            f"for {device}: the JAX engine runs only XLA-compilable steps (as a TPU does); move "
            "it to the input_fn or a host_call, or run with --engine=distribute")
  first = error.strip().splitlines()[0] if error.strip() else error
  return f"TensorFlow's XLA bridge cannot lower the {step_name} for {tf_platform}: {first}"


# The primitive.

def _abstract_eval(*avals, step):
  del avals
  return step.out_avals


_step_p.def_abstract_eval(_abstract_eval)


def _impl(*args, step):
  """Outside jax.jit: the step compiled on its own."""
  return jax.jit(functools.partial(_step_p.bind, step=step))(*args)


_step_p.def_impl(_impl)


def _lowering(ctx, *operands, platform, step):
  """Calls TensorFlow's lowering of step for platform from the module JAX is building."""
  module = ir.Module.parse(jax_mlir.hlo_to_stablehlo(step.hlo(TF_PLATFORMS[platform])))
  _drop_copies(module.operation)
  main = ir.SymbolTable(module.operation)["main"]
  param_types = list(main.type.inputs)
  result_types = list(main.type.results)
  operands = list(operands)
  constants = [mlir.ir_constant(value) for _, value in sorted(step._constants.items())]  # pylint: disable=protected-access
  # The captures: the variables (operands after the arguments), then the constants, in
  # capture order; a step whose captures interleave them is given them interleaved.
  num_args = len(operands) - len(step.variables)
  captured = _in_capture_order(operands[num_args:], constants, step)
  operands = operands[:num_args] + captured
  if len(operands) != len(param_types):
    raise LoweringError(
        f"the {step.name} lowered to a computation of {len(param_types)} parameters for "
        f"{len(operands)} values (arguments and captured variables): a captured tensor "
        "was folded into a constant; give it to the step as an argument")
  operands = [_converted(x, t) for x, t in zip(operands, param_types)]
  callee = mlir.merge_mlir_modules(ctx.module_context.module, f"tensorflow_{step.name}",
                                   module, dst_symtab=ctx.module_context.symbol_table)
  call = func_dialect.CallOp(result_types, ir.FlatSymbolRefAttr.get(callee), operands)
  results = list(call.results)[:len(step.out_avals)]
  return [_converted(r, _ir_type(ctx, aval)) for r, aval in zip(results, ctx.avals_out)]


def _drop_copies(operation):
  """Takes out the copies TensorFlow's bridge puts before each result (`mhlo.copy`, no StableHLO).

  A copy is the identity on values; without them the module is StableHLO, which
  jax.export serializes.
  """
  for region in operation.regions:
    for block in region.blocks:
      for op in list(block.operations):
        _drop_copies(op.operation)
        if op.operation.name == "mhlo.copy":
          op.operation.results[0].replace_all_uses_with(op.operation.operands[0])
          op.operation.erase()


def _in_capture_order(variable_values, constants, step):
  values, variables, constants = [], iter(variable_values), iter(constants)
  for captured in step.concrete.captured_inputs:
    values.append(next(variables) if captured.dtype == tf.resource else next(constants))
  return values


def _ir_type(ctx, aval):
  try:  # jax >= 0.8 asks for the module context
    return mlir.aval_to_ir_type(ctx.module_context, aval)
  except TypeError:
    return mlir.aval_to_ir_type(aval)


def _converted(value, ir_type):
  """value as ir_type: JAX without x64 holds TensorFlow's 64-bit values (int64 steps) in 32 bits."""
  if value.type == ir_type:
    return value
  return stablehlo.ConvertOp(ir_type, value).result


for _platform in TF_PLATFORMS:
  mlir.register_lowering(_step_p, functools.partial(_lowering, platform=_platform),
                         platform=_platform)
