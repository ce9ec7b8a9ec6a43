"""Export the latest checkpoint in --model_dir as a SavedModel for CPU/GPU serving.

    python export.py --model_dir=MODEL --export_dir=EXPORT

The model is rebuilt from MODEL/config.json; no model flags need retyping.
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
from estimator_tpu.training import assemble
from estimator_tpu.training import loop

FLAGS = flags.FLAGS


def run(flag_values):
  """Exports; returns the process exit status."""
  try:
    config, checkpoint = assemble.prepare_export(
        flag_values["model_dir"].value, flag_values["export_dir"].value)
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    print(f"export.py: error: {e}", file=sys.stderr)
    return 2
  path = saved_model.export_saved_model(estimator, flag_values["export_dir"].value,
                                       checkpoint_path=checkpoint)
  loop.say(f"exported {checkpoint} to {path}")
  return 0


def main():
  """The `export.py` / `estimator-tpu-export` command."""
  cli.quiet_tensorflow()
  flags_lib.define_flags()
  app.run(cli.make_main("export.py", run, FLAGS))


if __name__ == "__main__":
  main()
