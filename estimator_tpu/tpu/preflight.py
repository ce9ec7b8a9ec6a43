"""train.py --preflight: checks on CPU, with no TPU, what a TPU run of the same flags needs.

Prints one line per finding (PASS, WARN or FAIL and a message) and a verdict;
preflight() returns the exit status, 0 or 1. The checks assume a TPU run
whether or not --use_tpu is given. With --engine=distribute (or auto picking
it) the step compiled is the engine's own TRAIN and EVAL function, one
replica with jit_compile, in place of TPUEstimator's step and TPU graph.
"""

import sys

import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.model import precision as precision_lib
from estimator_tpu.model import user_model_fn
from estimator_tpu.run import assemble
from estimator_tpu.run import loop
from estimator_tpu.tpu import checks as tpu_checks
from estimator_tpu.tpu import pods
from estimator_tpu.tpu.findings import FAIL
from estimator_tpu.tpu.findings import PASS
from estimator_tpu.tpu.findings import WARN
from estimator_tpu.tpu.findings import Finding
from estimator_tpu.tpu.findings import report

BATCH_MULTIPLE = 8
WIDTH_MULTIPLE = 8
LARGE_WIDTH_MULTIPLE = 128
LARGE_FAN_IN = 1024
ModeKeys = stacks.ModeKeys


def per_core_batch(global_batch, num_cores):
  """The batch each TPU core gets (params['batch_size']); at least 1."""
  return max(1, global_batch // num_cores)


def check_batches(config):
  """Global batches divide by --num_cores; per-core batches are multiples of 8."""
  t, cores = config.train, config.runtime.num_cores
  errors = config_lib.batch_share_errors(t, cores, f"--num_cores={cores}")
  findings = []
  for flag, value in (("train_batch_size", t.train_batch_size),
                      ("eval_batch_size", t.eval_batch_size)):
    share = per_core_batch(value, cores)
    if flag in errors:
      findings.append(Finding(FAIL, errors[flag]))
    elif share % BATCH_MULTIPLE:
      findings.append(Finding(WARN, (
          f"--{flag}={value} gives each of the {cores} cores {share} examples, not a "
          f"multiple of {BATCH_MULTIPLE}: the TPU pads the batch and wastes the rest; try "
          f"--{flag}={cores * BATCH_MULTIPLE * max(1, round(share / BATCH_MULTIPLE))}")))
    else:
      findings.append(Finding(PASS, f"--{flag}={value} = {cores} cores x {share}"))
  return findings


def _named_specs(structure, name):
  """[(name, TensorSpec)] with names like features['image'] for a nested element_spec."""
  if isinstance(structure, dict):
    return [item for key in sorted(structure)
            for item in _named_specs(structure[key], f"{name}['{key}']")]
  if isinstance(structure, (tuple, list)):
    return [item for i, value in enumerate(structure)
            for item in _named_specs(value, f"{name}[{i}]")]
  return [(name, structure)]


def _shape_text(shape):
  return "unknown rank" if shape.rank is None else str(shape.as_list())


def _spec_findings(label, name, spec, batch_size):
  shape = spec.shape
  if shape.rank is None or not shape.is_fully_defined():
    dynamic = ("all of them" if shape.rank is None else
               ", ".join(str(i) for i, d in enumerate(shape.as_list()) if d is None))
    return [Finding(FAIL, (
        f"{label}: {name} has shape {_shape_text(shape)}, dimension {dynamic} not static: "
        f"XLA needs fixed shapes; batch with drop_remainder=True and give images a "
        f"fixed size"))]
  if spec.dtype == tf.string:
    return [Finding(FAIL, f"{label}: {name} is a string tensor: the TPU infeed carries "
                          f"numbers only; decode it in the input_fn")]
  if name == "labels" and shape.rank and shape[0] != batch_size:
    return [Finding(FAIL, (
        f"{label}: labels batch is {shape[0]}, but params['batch_size'] is {batch_size}: "
        f"batch by params['batch_size'], the per-core batch TPUEstimator passes"))]
  if spec.dtype == tf.float64:
    return [Finding(WARN, f"{label}: {name} is float64; TPUs compute in float32/bfloat16")]
  return []


def check_input(label, input_fn, params):
  """An input_fn gives fully static per-core shapes; the PASS line lists them."""
  batch_size = params["batch_size"]
  with tf.Graph().as_default():
    try:
      element = input_fn(params).element_spec
    except Exception as e:
      return [Finding(FAIL, f"{label}: the input_fn failed: {type(e).__name__}: {e}")]
  if isinstance(element, tuple) and len(element) == 2:
    specs = _named_specs(element[0], "features") + _named_specs(element[1], "labels")
  else:
    specs = _named_specs(element, "features")
  findings = [f for name, spec in specs for f in _spec_findings(label, name, spec, batch_size)]
  if not any(f.status == FAIL for f in findings):
    shapes = ", ".join(f"{name} {spec.dtype.name} {_shape_text(spec.shape)}"
                       for name, spec in specs)
    findings.insert(0, Finding(PASS, f"{label} per core: {shapes}"))
  return findings


_STEP_NAMES = {ModeKeys.TRAIN: "training step (forward, loss, gradients, update)",
               ModeKeys.EVAL: "evaluation step (forward, loss, eval_metrics tensors)"}


ENGINE_WHOSE = "the distribute engine's per-replica"


def _where(op):
  return (f"{op.op_type} (node {op.node}) in layer/scope '{op.scope}'"
          f"{', created at ' + op.created_at if op.created_at else ''}")


def _outside_table_finding(op, mode, engine):
  version, _ = tpu_checks.tpu_op_table()
  return Finding(FAIL, (
      f"{'distribute engine ' if engine else ''}{mode.upper()} step: TPUs cannot run "
      f"{_where(op)}: it is not among the ops TensorFlow's TPU compiler supports "
      f"(estimator_tpu/tpu/tpu_ops.txt, from the TPU build of TensorFlow {version}); do this "
      f"in the input_fn (tf.data, on the host) or use another op"))


def _step_result_findings(step, mode=ModeKeys.TRAIN, whose="one core's"):
  """The table's verdict on the step's ops, then what compiling and running it on CPU showed."""
  name = _STEP_NAMES[mode]
  engine = whose == ENGINE_WHOSE
  findings = [_outside_table_finding(op, mode, engine) for op in step.outside_table]
  if not step.error:
    if not findings:
      findings.append(Finding(PASS, (
          f"{whose} {name} compiles with XLA{' (jit_compile)' if engine else ''} "
          f"and runs on a real batch: loss {step.loss:.4f} ({step.seconds:.1f}s)")))
    return findings
  if not step.unsupported:
    return findings + [Finding(FAIL, f"{whose} {name.split(' (')[0]} does not compile or "
                                     f"run: {step.error}")]
  named = {op.op_type for op in step.outside_table}
  # An op TPUs compile that this TensorFlow's XLA for the CPU lacks: the CPU cannot check the rest.
  return findings + [Finding(WARN, (
      f"{whose} {name.split(' (')[0]} was not run on CPU: XLA for the CPU of TensorFlow "
      f"{tf.__version__} cannot compile {_where(op)}, which TPUs compile; shapes and values "
      f"were not checked")) for op in step.unsupported if op.op_type not in named]


def _op_findings(step):
  findings = []
  if step.summaries:
    names = ", ".join(step.summaries[:5])
    findings.append(Finding(WARN, (
        f"{len(step.summaries)} summary call{'' if len(step.summaries) == 1 else 's'} in "
        f"the model_fn ({names}): on a TPU they write "
        f"nothing (TensorFlow skips them inside the TPU computation); a TPU core cannot write "
        f"summaries; return them through TPUEstimatorSpec(host_call=(host_call_fn, "
        f"[tensors])), where host_call_fn writes them on the host")))
  for op in tpu_checks.forbidden_ops(step.ops):
    why = ("a Python callback cannot run on a TPU" if op.type in tpu_checks.PY_FUNC_OPS
           else "string tensors cannot live on a TPU")
    findings.append(Finding(FAIL, f"{op.type} op {op.name} in the model graph: {why}"))
  for tensor in tpu_checks.missing_dtype_tensors(step.ops):
    findings.append(Finding(FAIL, (
        f"tensor {tensor.name} is {tensor.dtype.name}, which a TPU cannot hold; compute in "
        f"complex64 or float32")))
  doubles = tpu_checks.float64_ops(step.ops)
  if doubles:
    names = ", ".join(f"{op.name} ({op.type})" for op in doubles[:5])
    findings.append(Finding(WARN, f"{len(doubles)} float64 ops in the model graph, e.g. "
                                  f"{names}: TPUs compute in float32/bfloat16"))
  return findings


def check_layer_widths(layers, num_classes):
  """Conv/dense widths: multiples of 8, of 128 for large layers (Cloud TPU performance guide)."""
  narrow, large, classifier = [], [], 0
  for layer, kind, fan_in, width in layers:
    if width == num_classes:
      classifier += 1
    elif width % WIDTH_MULTIPLE:
      narrow.append(f"{layer} ({kind}, {width} outputs)")
    elif fan_in >= LARGE_FAN_IN and width % LARGE_WIDTH_MULTIPLE:
      large.append(f"{layer} ({kind}, {fan_in} inputs, {width} outputs)")
  findings = []
  if narrow:
    findings.append(Finding(WARN, (
        f"layer widths not a multiple of {WIDTH_MULTIPLE} leave the TPU's matrix units "
        f"partly idle: {'; '.join(narrow)}")))
  if large:
    findings.append(Finding(WARN, (
        f"large layers (>= {LARGE_FAN_IN} inputs per output) with widths not a multiple "
        f"of {LARGE_WIDTH_MULTIPLE}: {'; '.join(large)}")))
  if not findings and layers:
    exempt = f", not counting the {num_classes}-way classifier" if classifier else ""
    findings.append(Finding(PASS, (
        f"widths of {len(layers) - classifier} conv/dense layers are multiples of "
        f"{WIDTH_MULTIPLE} ({LARGE_WIDTH_MULTIPLE} where large){exempt}")))
  return findings


def _tpu_path_findings(step, precision, cross_shard=True):
  """CrossShardOptimizer (TPUEstimator's TPU path only) and what computes in bfloat16."""
  findings = []
  if not cross_shard:
    pass  # under a strategy, wrapped or not, the strategy averages the gradients once
  elif step.cross_replica_sums:
    findings.append(Finding(PASS, (
        f"gradients of {step.cross_replica_sums} variables are summed over cores "
        f"(CrossShardOptimizer)")))
  elif step.ops:
    findings.append(Finding(WARN, (
        "the optimizer is not wrapped in tf.compat.v1.tpu.CrossShardOptimizer when "
        "params['use_tpu']: every core would apply only its own gradients")))
  return findings + precision_findings(step, precision)


def precision_findings(step, precision):
  """What computes in bfloat16 on the TPU: --precision's layers, or the model_fn's own choice."""
  if not step.ops:
    return []
  layers = len(tpu_checks.forward_matrix_ops(step.ops))
  bfloat16 = len(tpu_checks.bfloat16_ops(step.ops))
  if precision == precision_lib.BFLOAT16:
    if bfloat16:
      return [Finding(PASS, f"--precision=bfloat16: {bfloat16} of {layers} conv/dense layers "
                            "compute in bfloat16 (variables, logits and loss float32)")]
    return [Finding(WARN, "--precision=bfloat16, but no conv/dense layer computes in "
                          "bfloat16: the model_fn reads neither params['precision'] nor "
                          "params['use_bfloat16'] (or casts back before its layers)")]
  if bfloat16:
    return [Finding(PASS, f"{bfloat16} of {layers} conv/dense layers compute in bfloat16, as "
                          "the model_fn chooses itself (e.g. its own bfloat16_scope)")]
  return [Finding(PASS, f"--precision={precision}: the {layers} conv/dense layers compute in "
                        "float32 (--precision=bfloat16 runs them at the TPU's full matrix "
                        "rate, on the same float32 variables)")]


def check_precision(config):
  """float16 on a TPU is a FAIL line: its matrix units take bfloat16."""
  if config.precision != precision_lib.FLOAT16:
    return []
  return [Finding(FAIL, "--precision=float16 is not for TPUs, whose matrix units take "
                        "bfloat16: use --precision=bfloat16 (float16 is for GPUs)")]


def check_train_step(config, model_fn, input_fn, params):
  """Compiles one core's training step with XLA on CPU and inspects its graph."""
  step = tpu_checks.compile_train_step(model_fn, input_fn, params)
  findings = _step_result_findings(step) + _op_findings(step)
  findings += check_layer_widths(tpu_checks.layer_widths(step.ops),
                                 config.data.num_label_classes)
  return findings + _tpu_path_findings(step, config.precision)


def check_eval_step(model_fn, input_fn, params):
  """Compiles one core's evaluation step with XLA: ops only the EVAL branch builds."""
  step = tpu_checks.compile_train_step(model_fn, input_fn, params, ModeKeys.EVAL)
  return _step_result_findings(step, ModeKeys.EVAL) + _op_findings(step)


def check_engine_steps(config, model_fn, input_fns, params):
  """--engine=distribute: its TRAIN and EVAL steps, XLA-compiled for one replica, and their graphs.

  Args:
    config: the run's Config.
    model_fn: the TPUEstimator model_fn of the run.
    input_fns: [(mode, input_fn)], TRAIN first.
    params: the params of a TPU run; batch sizes are taken per core.
  """
  t, cores = config.train, config.runtime.num_cores
  batches = {ModeKeys.TRAIN: per_core_batch(t.train_batch_size, cores),
             ModeKeys.EVAL: per_core_batch(t.eval_batch_size, cores)}
  steps = tpu_checks.compile_engine_steps(model_fn, input_fns, params, batches)
  findings = []
  for mode, step in steps.items():
    findings += _step_result_findings(step, mode, ENGINE_WHOSE) + _op_findings(step)
  train = steps[ModeKeys.TRAIN]
  findings += check_layer_widths(tpu_checks.layer_widths(train.ops),
                                 config.data.num_label_classes)
  return findings + _tpu_path_findings(train, config.precision, cross_shard=False)


def engine_of(config):
  """The engine a TPU run of config uses: --engine, or what --engine=auto picks on the TPU."""
  engine, _ = estimator_lib.resolve_engine(config.replace("runtime", use_tpu=True).runtime)
  return engine


def check_tpu_graphs(config, model_fn, input_fns):
  """TPUEstimator builds its TPU graphs for --num_cores cores (built, never run)."""
  cores = config.runtime.num_cores
  tpu_config = config.replace("runtime", use_tpu=True, strategy="none")
  findings = []
  try:
    estimator = estimator_lib.build_estimator(
        tpu_config, config.data.class_names, model_fn,
        resolver_fn=tpu_checks.stand_in_resolver)
    for mode, input_fn in input_fns:
      types = tpu_checks.graph_op_types(
          tpu_checks.build_tpu_graph(estimator, input_fn, mode, cores))
      parts = [name for name, op in (("infeed", "InfeedDequeueTuple"),
                                     ("CrossReplicaSum", "CrossReplicaSum"),
                                     ("outfeed for host_call/eval_metrics",
                                      "OutfeedEnqueueTuple")) if op in types]
      findings.append(Finding(PASS, (
          f"TPUEstimator builds its TPU {mode} graph for {cores} cores "
          f"({', '.join(parts)})")))
  except Exception as e:
    findings.append(Finding(FAIL, (
        f"TPUEstimator cannot build its TPU graph for {cores} cores: "
        f"{type(e).__name__}: {tpu_checks.first_line(e)}")))
  return findings


def run_checks(config, model_fn, train_input_fn, eval_input_fn=None, train_pattern=None):
  """All checks for config; returns [Finding].

  Args:
    config: a validated, data-resolved Config (use_tpu may be False).
    model_fn: the TPUEstimator model_fn of the run.
    train_input_fn: input_fn(params) of the run's training data.
    eval_input_fn: the evaluation one, or None.
    train_pattern: the training files, named in the pod check's findings.
  """
  t, r = config.train, config.runtime
  # The params a TPU run gets (--augment_on=auto augments on the device there).
  params = estimator_lib.build_params(config.replace("runtime", use_tpu=True),
                                      config.data.class_names)
  train_params = dict(params, batch_size=per_core_batch(t.train_batch_size, r.num_cores))
  findings = check_batches(config) + check_precision(config)
  findings += check_input("train input", train_input_fn, train_params)
  if eval_input_fn is not None:
    eval_params = dict(params, batch_size=per_core_batch(t.eval_batch_size, r.num_cores))
    findings += check_input("eval input", eval_input_fn, eval_params)
  if not any(f.status == FAIL for f in findings):
    findings += pods.pod_findings(config, train_input_fn, eval_input_fn, train_pattern, params)
  if engine_of(config) == "distribute":
    modes = [(ModeKeys.TRAIN, train_input_fn)]
    if eval_input_fn is not None:  # the engine evaluates on the TPU, whatever --eval_on_tpu says
      modes.append((ModeKeys.EVAL, eval_input_fn))
    findings += check_engine_steps(config, model_fn, modes, dict(params, use_tpu=True))
  else:
    findings += _estimator_findings(config, model_fn, train_input_fn, eval_input_fn, params,
                                    findings)
  return list(dict.fromkeys(findings))  # an op in both steps is named once


def _estimator_findings(config, model_fn, train_input_fn, eval_input_fn, params, so_far):
  """TPUEstimator's step, XLA-compiled for one core, and (after no FAIL so far) its TPU graphs."""
  t, r = config.train, config.runtime
  eval_on_tpu = eval_input_fn is not None and r.eval_on_tpu
  findings = check_train_step(config, model_fn, train_input_fn, dict(
      params, use_tpu=True, batch_size=per_core_batch(t.train_batch_size, r.num_cores)))
  if eval_on_tpu:
    findings += check_eval_step(model_fn, eval_input_fn, dict(
        params, use_tpu=True, batch_size=per_core_batch(t.eval_batch_size, r.num_cores)))
  if not any(f.status == FAIL for f in so_far + findings):
    modes = [(ModeKeys.TRAIN, train_input_fn)]
    if eval_on_tpu:
      modes.append((ModeKeys.EVAL, eval_input_fn))
    findings += check_tpu_graphs(config, model_fn, modes)
  return findings


def prepare(config):
  """(config, DataInfo) as assemble.prepare makes them, minus its TPU batch check.

  A batch that does not divide by --num_cores becomes a FAIL line, not an
  error before the report. Nothing is written to --model_dir.
  """
  use_tpu = config.runtime.use_tpu
  config = config.replace("runtime", use_tpu=False).validate()
  config, info = assemble.resolve_data(config, need_train=True,
                                       need_eval=config.runtime.mode != "train")
  return config.replace("runtime", use_tpu=use_tpu), info


def preflight(config, out=None):
  """Runs every check for the run's config, prints the report (on stdout); returns 0 or 1.

  Args:
    config: the run's unvalidated Config (flags_lib.config_for_model_dir()).
    out: where the report goes (stdout).
  """
  out = out or sys.stdout
  try:
    config, info = prepare(config)
    model_fn = user_model_fn.load_model_fn(config.model.model_fn)
  except config_lib.ConfigError as e:
    findings = [Finding(FAIL, str(e))]
  else:
    r = config.runtime
    print(f"preflight: TPU checks on CPU for --num_cores={r.num_cores} "
          f"({'--use_tpu' if r.use_tpu else 'as if --use_tpu'}), engine {engine_of(config)}, "
          f"model "
          f"{config.model.model_fn or config.model.model}", file=out)
    inputs = loop.make_inputs(config, info)
    findings = run_checks(config, model_fn, inputs.train_input_fn, inputs.eval_input_fn,
                          info.train_pattern)
  return report(findings, out)
