"""The flags of train.py and export.py: define_flags(), config_for_model_dir() (their only reader).

Every field of the Config sections is a flag of the same name. Precedence:
defaults < the config.json already in --model_dir < flags typed on the
command line (FLAGS[name].present).
"""

import dataclasses

from absl import flags

from estimator_tpu import config as config_lib
from estimator_tpu.model import precisions as precision_lib

# Derived from the data on disk, not flags; the counts are re-read at every run.
DERIVED = {"num_train_examples", "num_eval_examples", "class_names"}

HELP = {
    "data_dir": "A preprocess.py output directory (train-*, validation-*, labels.txt, "
                "manifest.json) or a tensorflow/tpu jpeg_to_tf_record.py one.",
    "train_data": "File pattern of training TFRecords (overrides --data_dir's).",
    "eval_data": "File pattern of evaluation TFRecords (overrides --data_dir's).",
    "labels_file": "Class names, one per line in label order (default: DATA_DIR/labels.txt).",
    "num_label_classes": "Number of classes, for data with no labels file.",
    "image_size": "Side of the square images fed to the network, in pixels.",
    "cache": "Cache decoded images in memory (before augmentation).",
    "random_flip": "Random left/right flips in training (turn off for digits or text).",
    "eval_crop": "Central fraction that evaluation and the exported model keep before "
                 "resizing, in the form of --eval_crop_form (1.0: the whole image). Default: "
                 "a model dir keeps its own (1.0 if it predates the flag); a new run takes "
                 "0.875 at --image_size >= 128, else 1.0.",
    "eval_crop_form": "What --eval_crop keeps: square (a centred square of --eval_crop x "
                      "the shorter side, as tensorflow/tpu evaluates) or per_side "
                      "(--eval_crop of each side, stretched to a square by the resize). "
                      "Default: square for a new run; a model dir keeps its own (per_side "
                      "if it predates the flag) and refuses the other.",
    "model": "Network: flowers (the Cloud TPU flowers CNN), resnet or tiny.",
    "resnet_depth": "ResNet depth: 18, 34 or 50.",
    "dropout_rate": "Dropout before the classifier.",
    "label_smoothing": "Label smoothing of the cross-entropy loss.",
    "weight_decay": "L2 weight decay (batch-norm parameters excluded).",
    "model_fn": "Your own TPUEstimator model_fn as package.module:function.",
    "hparams": "Extra params entries for a model_fn: key=value,key=value.",
    "precision": "What the network computes in: float32, bfloat16 (TPUs, GPUs, CPUs with AMX "
                 "or AVX512-BF16) or float16 (GPUs, with dynamic loss scaling; not on TPUs). "
                 "Variables, their updates, logits and the loss stay float32, so a run "
                 "resumes in another precision; the SavedModel computes in float32. Saved in "
                 "config.json.",
    "train_steps": "Total training steps (global batches).",
    "steps_per_eval": "Training steps between evaluations (and checkpoints).",
    "train_batch_size": "Global training batch, over all cores.",
    "eval_batch_size": "Global evaluation batch; the last one is padded, never dropped.",
    "base_learning_rate": "Learning rate for a global batch of 256; scaled linearly.",
    "optimizer": "momentum or adam.",
    "momentum": "Momentum of the momentum optimizer.",
    "lr_schedule": "cosine, step or constant decay after warm-up.",
    "warmup_steps": "Steps of linear learning-rate warm-up.",
    "save_checkpoints_steps": "Steps between checkpoints (default: --steps_per_eval).",
    "seed": "Random seed (0: not fixed).",
    "deterministic": "Reproducible training: with the same --seed, data and starting "
                     "checkpoint, two runs give the same losses step for step "
                     "(deterministic ops and input order; slower input). Needs --seed.",
    "transpose_input": "Feed images as HWCN (faster on TPU); undone in model_fn.",
    "warm_start_from": "Checkpoint or model dir to warm-start from (transfer learning).",
    "model_dir": "Where checkpoints, config.json, summaries and curves go (local or gs://).",
    "export_dir": "Export a SavedModel here at the end of training.",
    "mode": "train, eval (follows new checkpoints) or train_and_eval.",
    "use_tpu": "Run on Cloud TPU through TPUEstimator.",
    "tpu": "Name or grpc:// address of the Cloud TPU.",
    "tpu_zone": "GCE zone of the Cloud TPU (optional).",
    "gcp_project": "GCP project of the Cloud TPU (optional).",
    "num_cores": "TPU cores (shards) to train on.",
    "cores_per_host": "TPU cores each host of a pod slice feeds: 8 on v2/v3/v5e, 4 on v4.",
    "tpu_topology": "The TPU's accelerator type (v3-8, v4-32, v5litepod-8, ...): sets "
                    "--num_cores (and --cores_per_host) unless they are given.",
    "iterations_per_loop": "Steps run on the TPU per session.run (host round trip); on "
                           "CPU/GPU too with --host_loop.",
    "host_loop": "Off TPU, train --iterations_per_loop steps per session.run in a loop, as a "
                 "TPU does (less per-step overhead for small steps; the model_fn must follow "
                 "the TPU rules, and a stop or a checkpoint waits for the loop in flight).",
    "summary_every_n_steps": "Write the train/* summaries (host_call) every N steps; on a TPU "
                             "the host_call outfeed then runs every N steps only.",
    "use_bfloat16": "The old spelling of --precision=bfloat16.",
    "eval_on_tpu": "Evaluate on the TPU too (else on the host CPU).",
    "strategy": "none (--engine=estimator: one device; --engine=distribute: every local GPU "
                "when there are several, else one device; --engine=jax: every JAX device), "
                "one_device, mirrored (all local GPUs, else all logical CPUs; --engine=jax: "
                "every JAX device) or multi_worker (TF_CONFIG; --engine=jax: jax.distributed "
                "over its cluster).",
    "engine": "What runs the model_fn: estimator (TPUEstimator, TF 1 sessions: CPU, GPU, "
              "TPU v2-v4), distribute (tf.functions under a tf.distribute strategy: "
              "TPUStrategy with --use_tpu, any TPU including v5e/v5p/v6e on PJRT), jax "
              "(each step lowered by TensorFlow's XLA bridge and run by JAX on every JAX "
              "device: CPUs, CUDA 12/13 GPUs, TPUs TensorFlow's builds no longer reach) or "
              "auto (distribute on a PJRT TPU, else estimator). Saved in config.json.",
    "jit_compile": "--engine=distribute: compile each replica's step with XLA on CPU/GPU, "
                   "the program a TPU would run.",
    "eval_timeout_secs": "--mode=eval: stop after this long with no new checkpoint.",
    "augment_on": "Where training flips, colour-jitters and normalizes: host (the input "
                  "pipeline), device (inside the model_fn, on the accelerator) or auto "
                  "(device with --use_tpu, else host).",
}

# --help lists the flags by Config section, under these titles.
SECTION_TITLES = {"data": "Data", "model": "Model", "train": "Training",
                  "runtime": "Where and how it runs"}

# Flags whose default is resolved per run (config_from_flags), not a field default.
RESOLVED_DEFAULTS = {"eval_crop": None, "eval_crop_form": None}

_DEFINERS = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
             float: flags.DEFINE_float, str: flags.DEFINE_string}


def _flag_fields():
  """(section name, dataclasses.Field) for every field that is a flag."""
  for section in dataclasses.fields(config_lib.Config):
    for field in dataclasses.fields(section.type):
      if field.name not in DERIVED:
        yield section.name, field


def define_flags(flag_values=flags.FLAGS):
  """Defines one flag per Config field (call once, from an entry point)."""
  for _, field in _flag_fields():
    if field.name not in flag_values:
      default = RESOLVED_DEFAULTS.get(field.name, field.default)
      _DEFINERS[field.type](field.name, default, HELP[field.name], flag_values=flag_values)


def help_groups():
  """[(title, [flag name])]: the Config flags by section, in field order, for --help."""
  groups = {}
  for section, field in _flag_fields():
    groups.setdefault(section, []).append(field.name)
  return [(SECTION_TITLES[section], names) for section, names in groups.items()]


def typed_flags(flag_values=flags.FLAGS):
  """{name: value} of the config flags the user typed."""
  return {field.name: flag_values[field.name].value for _, field in _flag_fields()
          if flag_values[field.name].present}


def config_from_flags(flag_values=flags.FLAGS, saved=None):
  """The Config: defaults, then `saved` (model_dir/config.json), then typed flags.

  Args:
    flag_values: parsed absl FlagValues.
    saved: the Config read from --model_dir, or None.

  Returns:
    An unvalidated Config.
  """
  # Data, model and training settings carry over from config.json; runtime
  # ones (where and how this invocation runs) do not.
  config = config_lib.Config()
  if saved is not None:
    config = dataclasses.replace(saved, runtime=config_lib.RuntimeConfig())
  typed = typed_flags(flag_values)
  for section, field in _flag_fields():
    if field.name in typed:
      config = config.replace(section, **{field.name: typed[field.name]})
  # A new run crops at photo sizes, in tensorflow/tpu's square form; a model
  # dir keeps what it was evaluated with.
  if saved is None and "eval_crop" not in typed:
    config = config.replace(
        "data", eval_crop=config_lib.default_eval_crop(config.data.image_size))
  if saved is None and "eval_crop_form" not in typed:
    config = config.replace("data", eval_crop_form=config_lib.EVAL_CROP_FORM)
  config = _resolve_precision(config, typed)
  return config.replace("data", num_train_examples=0, num_eval_examples=0)


def _resolve_precision(config, typed):
  """--use_bfloat16 (the old spelling) as --precision=bfloat16; the two fields agree after.

  Raises:
    ConfigError: --use_bfloat16 and a --precision other than bfloat16 typed together.
  """
  precision = config.model.precision
  if "use_bfloat16" in typed:
    old = typed["use_bfloat16"]
    if "precision" in typed and old != (precision == precision_lib.BFLOAT16):
      raise config_lib.ConfigError(
          f"--{'' if old else 'no'}use_bfloat16 (the old spelling of --precision=bfloat16) "
          f"conflicts with --precision={precision}: give --precision alone")
    if old:
      precision = precision_lib.BFLOAT16
    elif precision == precision_lib.BFLOAT16:
      precision = precision_lib.FLOAT32
  return (config.replace("model", precision=precision)
          .replace("runtime", use_bfloat16=precision == precision_lib.BFLOAT16))


def config_for_model_dir(flag_values=flags.FLAGS):
  """The run's Config from its flags and --model_dir's config.json; (config, saved).

  Args:
    flag_values: parsed absl FlagValues (after define_flags()).

  Returns:
    (config, saved): the unvalidated Config of this run (runtime.model_dir
    set), and the Config saved in --model_dir (None for a new model_dir).

  Raises:
    ConfigError: no --model_dir, or an unreadable config.json.
  """
  model_dir = flag_values["model_dir"].value
  if not model_dir:
    raise config_lib.ConfigError("--model_dir is required")
  saved = config_lib.read_config(model_dir)
  config = config_from_flags(flag_values, saved=saved)
  topology = config.runtime.tpu_topology
  if topology:
    # The TPU's shape gives the core counts unless those flags were typed.
    cores, per_host = config_lib.topology_cores(topology)
    typed = typed_flags(flag_values)
    derived = {"num_cores": cores, "cores_per_host": per_host}
    config = config.replace("runtime", **{name: value for name, value in derived.items()
                                          if value and name not in typed})
  return config.replace("runtime", model_dir=model_dir), saved
