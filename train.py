"""Train, evaluate and export an image classifier with TPUEstimator on CPU, GPU or TPU.

    python train.py --data_dir=DATA --model_dir=MODEL [--use_tpu --tpu=NAME]
    python train.py --data_dir=DATA --model_dir=MODEL --strategy=mirrored  # all GPUs
    python train.py ... --preflight  # on CPU: would this run work on a TPU?

Re-running the same command resumes from the last checkpoint in --model_dir.
"""

import os
import sys

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app
from absl import flags

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu.export import saved_model
from estimator_tpu.tpu import findings
from estimator_tpu.tpu import preflight
from estimator_tpu.training import assemble
from estimator_tpu.training import loop

FLAGS = flags.FLAGS


def define_entry_flags(flag_values=FLAGS):
  """Flags of this entry point that are not Config fields."""
  flags.DEFINE_bool("preflight", False,
                    "Check on CPU what a TPU run with these flags needs, print a "
                    "PASS/WARN/FAIL report and exit (0: pass, 1: fail); trains nothing.",
                    flag_values=flag_values)


def run(flag_values):
  """Runs --mode (or --preflight); returns the process exit status."""
  checking = "preflight" in flag_values and flag_values["preflight"].value
  try:
    config, saved = flags_lib.config_for_model_dir(flag_values)
    if checking:
      return preflight.preflight(config)
    mode = config.runtime.mode
    config, info = assemble.prepare(config, saved, need_train=mode != "eval",
                                    need_eval=mode != "train")
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    if checking:
      return findings.report([findings.Finding(findings.FAIL, str(e))])
    print(f"train.py: error: {e}", file=sys.stderr)
    return 2
  strategy = config.runtime.strategy
  loop.say(f"{mode} {config.model.model_fn or config.model.model} on "
           f"{info.num_classes} classes, {info.num_eval_examples} eval images, "
           f"{'' if strategy == 'none' else f'--strategy={strategy}, '}"
           f"model_dir={config.runtime.model_dir}")
  inputs = loop.make_inputs(config, info)
  if mode == "eval":
    loop.continuous_evaluate(estimator, config, inputs)
  else:
    loop.train_and_evaluate(estimator, config, inputs,
                            evaluate_each=mode == "train_and_eval")
  if config.runtime.export_dir:
    path = saved_model.export_saved_model(estimator, config.runtime.export_dir)
    loop.say(f"exported SavedModel to {path}")
  return 0


def main():
  """The `train.py` / `estimator-tpu-train` command."""
  cli.quiet_tensorflow()
  flags_lib.define_flags()
  define_entry_flags()
  app.run(cli.make_main("train.py", run, FLAGS))


if __name__ == "__main__":
  main()
