"""Config: precedence (defaults < config.json < typed flags), JSON round trip, conflicts, checks."""

import json
import os

from absl import flags
import pytest

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib


def _flags(*argv):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", *argv])
  return flag_values


def test_typed_flags_beat_config_json_which_beats_defaults():
  saved = (config_lib.Config()
           .replace("data", image_size=64)
           .replace("train", train_steps=500, base_learning_rate=0.5)
           .replace("runtime", use_tpu=True, model_dir="/old"))
  config = flags_lib.config_from_flags(_flags("--train_steps=900"), saved=saved)
  assert config.train.train_steps == 900            # typed
  assert config.train.base_learning_rate == 0.5     # from config.json
  assert config.data.image_size == 64               # from config.json
  assert config.train.train_batch_size == config_lib.TrainConfig().train_batch_size  # default
  # Runtime settings describe this invocation only: never carried over.
  assert config.runtime.use_tpu is False and config.runtime.model_dir == ""


def test_a_flag_typed_with_its_default_value_still_overrides_config_json():
  default_steps = config_lib.TrainConfig().train_steps
  saved = config_lib.Config().replace("train", train_steps=default_steps + 7)
  config = flags_lib.config_from_flags(_flags(f"--train_steps={default_steps}"), saved=saved)
  assert config.train.train_steps == default_steps


def test_config_json_round_trip(tmp_path):
  config = (config_lib.Config()
            .replace("data", image_size=48, num_label_classes=3, class_names=("a", "b", "ñ"))
            .replace("model", model="resnet", resnet_depth=34, hparams="extra=2")
            .replace("runtime", model_dir=str(tmp_path)))
  path = config_lib.write_config(config)
  assert path == os.path.join(str(tmp_path), config_lib.CONFIG_FILE)
  assert config_lib.read_config(str(tmp_path)) == config
  with open(path) as f:
    assert json.load(f)["data"]["class_names"] == ["a", "b", "ñ"]


def test_unknown_key_in_config_json_is_named(tmp_path):
  (tmp_path / config_lib.CONFIG_FILE).write_text(json.dumps({"train": {"trian_steps": 5}}))
  with pytest.raises(config_lib.ConfigError, match=r"unknown train settings \['trian_steps'\]"):
    config_lib.read_config(str(tmp_path))


def test_conflict_with_the_saved_model_names_both_values(tmp_path):
  saved = config_lib.Config().replace("data", image_size=32, num_label_classes=10)
  new = saved.replace("data", image_size=64).replace("runtime", model_dir=str(tmp_path))
  with pytest.raises(config_lib.ConfigError,
                     match=r"--image_size=64 conflicts with image_size=32 .*--image_size=32"):
    config_lib.check_compatible(saved, new)
  config_lib.check_compatible(saved, saved.replace("train", train_steps=1))  # not identity


def test_tpu_batches_must_divide_by_the_cores_with_a_suggestion():
  config = (config_lib.Config().replace("train", train_batch_size=100)
            .replace("runtime", use_tpu=True, num_cores=8, model_dir="/m"))
  with pytest.raises(config_lib.ConfigError,
                     match=r"--train_batch_size=100 must divide by --num_cores=8.*try 96 or 104"):
    config.validate()
  assert config.replace("runtime", use_tpu=False).validate()  # any batch off TPU


def test_params_are_basic_types_without_reserved_keys():
  params = config_lib.Config().replace("model", hparams="warmup_epochs=3,name=x").to_params()
  assert not set(params) & {"batch_size", "context"}
  assert params["warmup_epochs"] == 3 and params["name"] == "x"
  assert all(isinstance(v, (bool, int, float, str)) for v in params.values())


def test_hparams_may_not_shadow_a_flag():
  config = (config_lib.Config().replace("model", hparams="train_steps=5")
            .replace("runtime", model_dir="/m"))
  with pytest.raises(config_lib.ConfigError, match="use --train_steps=... instead"):
    config.validate()


@pytest.mark.parametrize("topology,cores,per_host", [
    ("v2-8", 8, 8), ("v3-32", 32, 8), ("v4-8", 4, 4), ("v4-32", 16, 4), ("v5p-16", 8, 4),
    ("v5litepod-8", 8, None)])
def test_tpu_topology_gives_the_cores_tpuestimator_shards_over(topology, cores, per_host):
  assert config_lib.topology_cores(topology) == (cores, per_host)


def test_tpu_topology_sets_num_cores_unless_typed():
  config, _ = flags_lib.config_for_model_dir(_flags("--model_dir=/m", "--tpu_topology=v4-32"))
  assert (config.runtime.num_cores, config.runtime.cores_per_host) == (16, 4)
  config, _ = flags_lib.config_for_model_dir(
      _flags("--model_dir=/m", "--tpu_topology=v4-32", "--num_cores=8"))
  assert (config.runtime.num_cores, config.runtime.cores_per_host) == (8, 4)
  with pytest.raises(config_lib.ConfigError, match="--tpu_topology=v9-8 is not an accelerator"):
    flags_lib.config_for_model_dir(_flags("--model_dir=/m", "--tpu_topology=v9-8"))


def test_deterministic_is_off_by_default_and_in_params():
  config = config_lib.Config().replace("runtime", model_dir="/m").validate()
  assert config.train.deterministic is False
  assert config.to_params()["deterministic"] is False
  typed, _ = flags_lib.config_for_model_dir(_flags("--model_dir=/m", "--seed=7"))
  assert typed.train.deterministic is False and typed.train.seed == 7


def test_deterministic_needs_a_seed_and_says_so():
  config, _ = flags_lib.config_for_model_dir(_flags("--model_dir=/m", "--deterministic"))
  with pytest.raises(config_lib.ConfigError, match=r"--deterministic needs a fixed --seed"):
    config.validate()
  config, _ = flags_lib.config_for_model_dir(
      _flags("--model_dir=/m", "--deterministic", "--seed=7"))
  assert config.validate().to_params()["deterministic"] is True


def test_deterministic_is_saved_and_carried_over_by_a_rerun(tmp_path):
  model_dir = str(tmp_path)
  config, _ = flags_lib.config_for_model_dir(
      _flags(f"--model_dir={model_dir}", "--deterministic", "--seed=7"))
  config_lib.write_config(config.validate())
  with open(os.path.join(model_dir, config_lib.CONFIG_FILE)) as f:
    assert json.load(f)["train"]["deterministic"] is True
  rerun, saved = flags_lib.config_for_model_dir(_flags(f"--model_dir={model_dir}"))
  assert saved.train.deterministic and rerun.train.deterministic and rerun.train.seed == 7
  off, _ = flags_lib.config_for_model_dir(
      _flags(f"--model_dir={model_dir}", "--nodeterministic"))
  assert off.train.deterministic is False


def test_config_json_from_before_the_flag_reads_as_not_deterministic(tmp_path):
  written = config_lib.Config().replace("train", seed=3).to_dict()
  del written["train"]["deterministic"]
  (tmp_path / config_lib.CONFIG_FILE).write_text(json.dumps(written))
  saved = config_lib.read_config(str(tmp_path))
  assert saved.train.deterministic is False and saved.train.seed == 3
