"""From the run's Config to a ready run: validated once, data resolved, config.json, estimator."""


from estimator_tpu import config as config_lib
from estimator_tpu import stacks
from estimator_tpu.data import data_dir
from estimator_tpu.engines import choose as estimator_lib
from estimator_tpu.model import precision
from estimator_tpu.model import user_model_fn
from estimator_tpu.run import checkpoints


def resolve_data(config, need_train, need_eval):
  """(config with the data's class names and counts filled in, DataInfo).

  Raises:
    ConfigError: missing files or labels, named with the flag to fix.
  """
  info = data_dir.resolve(config.data, need_train=need_train, need_eval=need_eval)
  config = config.replace("data", num_label_classes=info.num_classes,
                          class_names=tuple(info.class_names),
                          num_train_examples=info.num_train_examples,
                          num_eval_examples=info.num_eval_examples)
  return config, info


def prepare(config, saved, need_train, need_eval, write=True):
  """Validates config once, resolves the data, checks it against the saved model.

  Args:
    config: the run's Config (flags_lib.config_for_model_dir()).
    saved: the Config saved in its model_dir, or None.
    need_train: the run trains (training files must exist).
    need_eval: the run evaluates (evaluation files must exist).
    write: write the resolved config to model_dir/config.json.

  Returns:
    (config, DataInfo).

  Raises:
    ConfigError: a message naming the flag or file and the fix.
  """
  config, info = resolve_data(config.validate(), need_train, need_eval)
  engine, _ = estimator_lib.resolve_engine(config.runtime)
  config = config.replace("runtime", engine=engine)
  if saved is not None:
    config_lib.check_compatible(saved, config)
  if write:
    config_lib.write_config(config)
  return config, info


def prepare_export(model_dir, export_dir, report=print):
  """The saved config (set up for CPU/GPU) and newest restorable checkpoint of model_dir.

  Args:
    model_dir: the trained model's directory.
    export_dir: where the SavedModel goes.
    report: called with a line for each damaged checkpoint skipped.

  Raises:
    ConfigError: no --model_dir/--export_dir, no config.json, no checkpoint,
      or none that restores.
  """
  if not model_dir or not export_dir:
    raise config_lib.ConfigError("--model_dir and --export_dir are required")
  saved = config_lib.read_config(model_dir)
  if saved is None:
    raise config_lib.ConfigError(
        f"--model_dir={model_dir} holds no {config_lib.CONFIG_FILE}: train there first")
  # A damaged newer checkpoint is skipped (one line), never exported.
  checkpoint = checkpoints.newest_restorable(model_dir, fix=False, report=report)
  if not checkpoint:
    raise config_lib.ConfigError(
        f"--model_dir={model_dir} holds no checkpoint: train there first")
  return export_config(saved.replace("runtime", model_dir=model_dir)), checkpoint


def export_config(config):
  """The config whose estimator exports `config`'s model: CPU/GPU, float32.

  Never the TPU graph: the export is for CPU/GPU serving. The SavedModel
  computes in float32 whatever --precision trained it (its variables are
  float32), so it serves at full speed on any CPU; its signatures take and
  return float32 (or bytes and strings) in any case.
  """
  return (config.replace("runtime", use_tpu=False, strategy="none", engine="estimator",
                         jit_compile=False, use_bfloat16=False)
          .replace("model", precision=precision.FLOAT32))


def build(config, **kwargs):
  """The TPUEstimator running the configured model_fn.

  With --seed, Keras's initializers (which draw their seeds from Python's
  random module, not the graph seed) are seeded too, so weights repeat.
  """
  if config.train.seed:
    stacks.keras.utils.set_random_seed(config.train.seed)
  return estimator_lib.build_estimator(
      config, class_names=config.data.class_names,
      model_fn=user_model_fn.load_model_fn(config.model.model_fn), **kwargs)
