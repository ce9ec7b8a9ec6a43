"""Frozen configuration of a run: data, model, train and runtime sections; validate()."""

import dataclasses
import json
import os
import re

from estimator_tpu.data import crop_forms
from estimator_tpu.model import precisions as precision_lib

CONFIG_FILE = "config.json"
MODELS = ("flowers", "resnet", "tiny")
RESNET_DEPTHS = (18, 34, 50)
OPTIMIZERS = ("momentum", "adam")
LR_SCHEDULES = ("cosine", "step", "constant")
MODES = ("train", "eval", "train_and_eval")
STRATEGIES = ("none", "one_device", "mirrored", "multi_worker")
AUGMENT_ON = ("auto", "host", "device")
# What runs the model_fn: TPUEstimator's TF 1 sessions, tf.functions under a
# tf.distribute strategy (engines/distribute/engine.py), or steps lowered by
# TensorFlow and run by JAX (engines/jax/engine.py); auto picks per run.
ENGINES = ("auto", "estimator", "distribute", "jax")
# --precision: what the network computes in (variables stay float32).
PRECISIONS = precision_lib.PRECISIONS
# --eval_crop of a new run that does not give it: the central 224 of 256 at
# photo sizes (as tensorflow/tpu and Keras' ImageNet recipes evaluate); small
# images, like the 32 px digits, whole.
EVAL_CROP = 0.875
EVAL_CROP_MIN_IMAGE_SIZE = 128
# --eval_crop_form of a new run: tensorflow/tpu's centred square of the shorter
# side. A config.json written before the field means the per-side form.
EVAL_CROP_FORM = crop_forms.SQUARE
EVAL_CROP_FORMS = crop_forms.CROP_FORMS
# A re-run may change how long or how fast it trains, never what it trains.
IDENTITY_FIELDS = (("data", "image_size"), ("data", "num_label_classes"),
                   ("model", "model"), ("model", "resnet_depth"))
# Nor how it is evaluated and served, where curves and exports must stay comparable.
EVALUATION_FIELDS = (("data", "eval_crop_form"),)
# Paths (or file patterns) that config.json saves absolute when they are local.
PATH_FIELDS = (("data", "data_dir"), ("data", "train_data"), ("data", "eval_data"),
               ("data", "labels_file"), ("train", "warm_start_from"),
               ("runtime", "model_dir"), ("runtime", "export_dir"))


class ConfigError(ValueError):
  """A configuration value is invalid; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class DataConfig:
  data_dir: str = ""
  train_data: str = ""
  eval_data: str = ""
  labels_file: str = ""
  num_label_classes: int = 0
  num_train_examples: int = 0
  num_eval_examples: int = 0
  class_names: tuple = ()
  image_size: int = 224
  cache: bool = False
  random_flip: bool = True
  # 1.0 (the whole image) is what a config.json written before the key means.
  eval_crop: float = 1.0
  # crop_forms.PER_SIDE is what a config.json written before the key means.
  eval_crop_form: str = crop_forms.PER_SIDE


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  model: str = "flowers"
  resnet_depth: int = 50
  dropout_rate: float = 0.3
  label_smoothing: float = 0.0
  weight_decay: float = 1e-4
  model_fn: str = ""
  hparams: str = ""
  # A config.json written before the key means its runtime use_bfloat16 (from_dict).
  precision: str = precision_lib.FLOAT32


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  train_steps: int = 1000
  steps_per_eval: int = 250
  train_batch_size: int = 64
  eval_batch_size: int = 64
  base_learning_rate: float = 0.1
  optimizer: str = "momentum"
  momentum: float = 0.9
  lr_schedule: str = "cosine"
  warmup_steps: int = 0
  save_checkpoints_steps: int = 0
  summary_every_n_steps: int = 100
  seed: int = 0
  # Same seed, same data and checkpoint: the same losses, step for step.
  deterministic: bool = False
  transpose_input: bool = False
  warm_start_from: str = ""


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  model_dir: str = ""
  export_dir: str = ""
  mode: str = "train_and_eval"
  use_tpu: bool = False
  tpu: str = ""
  tpu_zone: str = ""
  gcp_project: str = ""
  num_cores: int = 8
  cores_per_host: int = 8
  tpu_topology: str = ""
  iterations_per_loop: int = 100
  # The old spelling of --precision=bfloat16; kept equal to it (flags.config_from_flags).
  use_bfloat16: bool = False
  eval_on_tpu: bool = True
  strategy: str = "none"
  eval_timeout_secs: int = 3600
  augment_on: str = "auto"
  host_loop: bool = False
  engine: str = "auto"
  jit_compile: bool = False


@dataclasses.dataclass(frozen=True)
class Config:
  data: DataConfig = DataConfig()
  model: ModelConfig = ModelConfig()
  train: TrainConfig = TrainConfig()
  runtime: RuntimeConfig = RuntimeConfig()

  def replace(self, section, **changes):
    """Returns a copy with fields of one section ('data', 'model', ...) changed."""
    updated = dataclasses.replace(getattr(self, section), **changes)
    return dataclasses.replace(self, **{section: updated})

  @property
  def precision(self):
    """What the network computes in: --precision, or bfloat16 where the old use_bfloat16 says so."""
    if self.runtime.use_bfloat16 and self.model.precision == precision_lib.FLOAT32:
      return precision_lib.BFLOAT16
    return self.model.precision

  def to_dict(self):
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, values):
    """Builds a Config from to_dict()'s output; unknown keys are an error."""
    sections = {}
    for field in dataclasses.fields(cls):
      section_type = field.type
      known = {f.name for f in dataclasses.fields(section_type)}
      given = dict(values.get(field.name, {}))
      unknown = set(given) - known
      if unknown:
        raise ConfigError(f"unknown {field.name} settings {sorted(unknown)} in {CONFIG_FILE}")
      if "class_names" in given:
        given["class_names"] = tuple(given["class_names"])
      sections[field.name] = section_type(**given)
    if "precision" not in values.get("model", {}):
      # Written before --precision: --use_bfloat16 was how a run asked for bfloat16.
      old = values.get("runtime", {}).get("use_bfloat16")
      sections["model"] = dataclasses.replace(
          sections["model"],
          precision=precision_lib.BFLOAT16 if old else precision_lib.FLOAT32)
    return cls(**sections)

  def validate(self):
    """Checks values that do not depend on the data on disk; raises ConfigError."""
    _validate_choices(self)
    _validate_sizes(self)
    self.to_params()  # surfaces a malformed --hparams now
    if self.runtime.use_tpu:
      _validate_tpu_batches(self)
    return self

  def to_params(self):
    """The flat dict of basic Python types handed to TPUEstimator as `params`.

    Key names follow tensorflow/tpu where the concept matches. Never holds
    `batch_size` or `context`: TPUEstimator reserves them.
    """
    d, m, t, r = self.data, self.model, self.train, self.runtime
    params = {
        "num_label_classes": d.num_label_classes,
        "image_size": d.image_size,
        "eval_crop": d.eval_crop,
        "eval_crop_form": d.eval_crop_form,
        "model": m.model,
        "resnet_depth": m.resnet_depth,
        "dropout_rate": m.dropout_rate,
        "label_smoothing": m.label_smoothing,
        "weight_decay": m.weight_decay,
        "train_steps": t.train_steps,
        "train_batch_size": t.train_batch_size,
        "eval_batch_size": t.eval_batch_size,
        "base_learning_rate": t.base_learning_rate,
        "optimizer": t.optimizer,
        "momentum": t.momentum,
        "lr_schedule": t.lr_schedule,
        "warmup_steps": t.warmup_steps,
        "transpose_input": t.transpose_input,
        "iterations_per_loop": r.iterations_per_loop,
        "summary_every_n_steps": t.summary_every_n_steps,
        "deterministic": t.deterministic,
        "num_cores": r.num_cores,
        "precision": self.precision,
        "use_bfloat16": self.precision == precision_lib.BFLOAT16,
        "model_dir": r.model_dir,
        "augment_on_device": augments_on_device(r),
    }
    extra = parse_hparams(m.hparams)
    clashes = sorted(set(extra) & set(params))
    if clashes:
      raise ConfigError(f"--hparams sets {', '.join(clashes)}, which are flags: "
                        f"use --{clashes[0]}=... instead")
    params.update(extra)
    return params


RESERVED_PARAMS = ("batch_size", "context", "use_tpu")


def default_eval_crop(image_size):
  """--eval_crop of a new run that does not give it: EVAL_CROP at >= 128 px, else 1.0."""
  return EVAL_CROP if image_size >= EVAL_CROP_MIN_IMAGE_SIZE else 1.0


def augments_on_device(runtime):
  """True when training flips, jitters and normalizes on the accelerator, not the host.

  --augment_on=auto picks the device on a TPU, whose host must decode every
  image the cores train on and is the usual bottleneck; elsewhere the host,
  where the work overlaps the training step instead of adding to it.
  """
  if runtime.augment_on == "auto":
    return runtime.use_tpu
  return runtime.augment_on == "device"


def _literal(text):
  lowered = text.lower()
  if lowered in ("true", "false"):
    return lowered == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def parse_hparams(text):
  """'learning_rate=0.1,batch_norm=true,name=x' -> {'learning_rate': 0.1, ...}.

  Values become bool, int, float or str. Raises ConfigError on a malformed
  entry or a key TPUEstimator reserves.
  """
  result = {}
  for item in filter(None, (part.strip() for part in text.split(","))):
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
      raise ConfigError(f"--hparams entry {item!r} is not key=value")
    if key in RESERVED_PARAMS:
      raise ConfigError(f"--hparams key {key!r} is reserved by TPUEstimator; rename it")
    result[key] = _literal(value.strip())
  return result


def _check(condition, message):
  if not condition:
    raise ConfigError(message)


def _validate_choices(config):
  d, m, t, r = config.data, config.model, config.train, config.runtime
  _check(d.eval_crop_form in EVAL_CROP_FORMS,
         f"--eval_crop_form={d.eval_crop_form} is not one of {', '.join(EVAL_CROP_FORMS)}")
  _check(m.model in MODELS or m.model_fn,
         f"--model={m.model} is not one of {', '.join(MODELS)}")
  _check(m.model != "resnet" or m.resnet_depth in RESNET_DEPTHS,
         f"--resnet_depth={m.resnet_depth} is not one of {RESNET_DEPTHS}")
  _check(m.precision in PRECISIONS,
         f"--precision={m.precision} is not one of {', '.join(PRECISIONS)}")
  _check(not r.use_bfloat16 or config.precision == precision_lib.BFLOAT16,
         f"--use_bfloat16 is the old spelling of --precision=bfloat16 and conflicts with "
         f"--precision={m.precision}: give one of them")
  _check(not (r.use_tpu and config.precision == precision_lib.FLOAT16),
         "--precision=float16 is not for TPUs, whose matrix units take bfloat16: use "
         "--precision=bfloat16 there (float16 is for GPUs)")
  _check(t.optimizer in OPTIMIZERS,
         f"--optimizer={t.optimizer} is not one of {', '.join(OPTIMIZERS)}")
  _check(t.lr_schedule in LR_SCHEDULES,
         f"--lr_schedule={t.lr_schedule} is not one of {', '.join(LR_SCHEDULES)}")
  _check(r.mode in MODES, f"--mode={r.mode} is not one of {', '.join(MODES)}")
  _check(r.strategy in STRATEGIES,
         f"--strategy={r.strategy} is not one of {', '.join(STRATEGIES)}")
  _check(r.engine in ENGINES, f"--engine={r.engine} is not one of {', '.join(ENGINES)}")
  _check(not (r.jit_compile and r.engine == "estimator"),
         "--jit_compile is for --engine=distribute (TPUEstimator compiles for a TPU itself)")
  _check(r.augment_on in AUGMENT_ON,
         f"--augment_on={r.augment_on} is not one of {', '.join(AUGMENT_ON)}")
  _check(not (r.use_tpu and r.strategy != "none"),
         f"--strategy={r.strategy} is for GPUs/CPUs; on TPU leave it unset "
         "(TPUEstimator distributes over the TPU cores itself)")
  _check(not t.deterministic or t.seed,
         "--deterministic needs a fixed --seed (e.g. --seed=1): the same seed then gives "
         "the same run; --seed=0 draws new random numbers each run")


def _validate_sizes(config):
  d, m, t, r = config.data, config.model, config.train, config.runtime
  _check(r.model_dir, "--model_dir is required")
  _check(d.image_size >= 8, f"--image_size={d.image_size} must be at least 8")
  _check(0 < d.eval_crop <= 1,
         f"--eval_crop={d.eval_crop} must be in (0, 1]: the central fraction "
         "evaluation and serving keep (1.0: the whole image)")
  _check(t.train_steps > 0, f"--train_steps={t.train_steps} must be positive")
  _check(t.steps_per_eval > 0, f"--steps_per_eval={t.steps_per_eval} must be positive")
  _check(t.train_batch_size > 0,
         f"--train_batch_size={t.train_batch_size} must be positive")
  _check(t.eval_batch_size > 0,
         f"--eval_batch_size={t.eval_batch_size} must be positive")
  _check(t.base_learning_rate > 0,
         f"--base_learning_rate={t.base_learning_rate} must be positive")
  _check(0 <= m.label_smoothing < 1,
         f"--label_smoothing={m.label_smoothing} must be in [0, 1)")
  _check(0 <= m.dropout_rate < 1, f"--dropout_rate={m.dropout_rate} must be in [0, 1)")
  _check(t.summary_every_n_steps > 0,
         f"--summary_every_n_steps={t.summary_every_n_steps} must be positive")
  _check(r.iterations_per_loop > 0,
         f"--iterations_per_loop={r.iterations_per_loop} must be positive")
  _check(r.num_cores > 0, f"--num_cores={r.num_cores} must be positive")
  _check(r.cores_per_host > 0 and (r.num_cores <= r.cores_per_host
                                   or r.num_cores % r.cores_per_host == 0),
         f"--num_cores={r.num_cores} must be a whole number of hosts of "
         f"--cores_per_host={r.cores_per_host} (a pod slice: 8 per host on v2/v3/v5e, 4 on v4)")


def _suggest_multiples(value, divisor):
  """'try 96 or 104' for value=100, divisor=8."""
  lower = value - value % divisor
  higher = lower + divisor
  return f"try {lower} or {higher}" if lower else f"try {higher}"


def batch_share_errors(train, shards, shards_named):
  """The rule that a global batch splits evenly, checked for both batches of `train`.

  The one place the rule lives: config validation (TPU cores), preflight (as
  FAIL lines) and the strategy estimator (replicas) all ask it.

  Args:
    train: a TrainConfig.
    shards: how many equal parts each global batch must split into.
    shards_named: how the message names them, e.g. '--num_cores=8 on TPU'.

  Returns:
    {flag: message} for each batch that does not divide; empty when both do.
  """
  return {flag: (f"--{flag}={value} must divide by {shards_named} (each gets an equal "
                 f"share); {_suggest_multiples(value, shards)}")
          for flag, value in (("train_batch_size", train.train_batch_size),
                              ("eval_batch_size", train.eval_batch_size))
          if value % shards}


def _validate_tpu_batches(config):
  r = config.runtime
  errors = batch_share_errors(config.train, r.num_cores, f"--num_cores={r.num_cores} on TPU")
  if errors:
    raise ConfigError(next(iter(errors.values())))


def read_config(model_dir):
  """The Config saved in model_dir, or None when there is none."""
  from estimator_tpu import storage  # TensorFlow's gfile: not before the flags are parsed
  path = os.path.join(model_dir, CONFIG_FILE)
  if not storage.exists(path):
    return None
  try:
    return Config.from_dict(json.loads(storage.read_text(path)))
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path} is not valid JSON ({e}); delete it or fix it") from e


def check_compatible(saved, config):
  """Raises ConfigError when config would train a different model than saved."""
  path = os.path.join(config.runtime.model_dir, CONFIG_FILE)
  fields = [(field, "holds a model trained with {name}={old}") for field in IDENTITY_FIELDS]
  fields += [(field, "that model is evaluated and served with") for field in EVALUATION_FIELDS]
  for (section, name), why in fields:
    old = getattr(getattr(saved, section), name)
    new = getattr(getattr(config, section), name)
    if old != new:
      raise ConfigError(
          f"--{name}={new} conflicts with {name}={old} in {path}, which "
          f"{why.format(name=name, old=old)}; use another --model_dir or --{name}={old}")


def write_config(config):
  """Writes config to model_dir/config.json (creating model_dir); returns the path.

  Local paths are saved absolute, so that a re-run from another folder (or
  export.py) finds the same data and directories.
  """
  import tensorflow as tf  # not before the flags are parsed: --help answers at once

  from estimator_tpu import storage
  tf.io.gfile.makedirs(config.runtime.model_dir)
  path = os.path.join(config.runtime.model_dir, CONFIG_FILE)
  saved = absolute_paths(config).to_dict()
  storage.write_atomically(path, json.dumps(saved, indent=2, sort_keys=True))
  return path


def absolute_paths(config):
  """config with its local paths (PATH_FIELDS) made absolute; gs:// and the like kept."""
  for section, name in PATH_FIELDS:
    value = getattr(getattr(config, section), name)
    if value and "://" not in value and not os.path.isabs(value):
      config = config.replace(section, **{name: os.path.abspath(value)})
  return config


# Accelerator types (gcloud --accelerator-type): the number counts TensorCores
# for v2/v3/v4/v5p and chips for v5e/v6e. TPUEstimator shards over cores: a
# v4 or v5p chip's two TensorCores act as one (megacore), so v4-8 has 4.
_TOPOLOGY = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v5e|v6e)-(\d+)$")
_CORES_PER_COUNT = {"v2": 1, "v3": 1, "v4": 0.5, "v5p": 0.5, "v5litepod": 1, "v5e": 1, "v6e": 1}
_CORES_PER_HOST = {"v2": 8, "v3": 8, "v4": 4, "v5p": 4}


def topology_cores(topology):
  """(num_cores, cores_per_host or None) of an accelerator type like 'v4-32'.

  Raises:
    ConfigError: not an accelerator type this knows.
  """
  match = _TOPOLOGY.match(topology)
  if not match:
    raise ConfigError(f"--tpu_topology={topology} is not an accelerator type like v3-8, "
                      f"v4-32 or v5litepod-8")
  generation, count = match.group(1), int(match.group(2))
  cores = int(count * _CORES_PER_COUNT[generation])
  per_host = _CORES_PER_HOST.get(generation)
  return cores, min(per_host, cores) if per_host else None
