"""Export the latest checkpoint in --model_dir as a SavedModel for CPU/GPU serving.

    python export.py --model_dir=MODEL --export_dir=EXPORT

The model is rebuilt from MODEL/config.json; no model flags need retyping.
"""

import os

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app
from absl import flags

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu.export import saved_model
from estimator_tpu.run import assemble
from estimator_tpu.run import checkpoints
from estimator_tpu.run import loop

FLAGS = flags.FLAGS
PROGRAM = "export.py"


def run(flag_values):
  """Exports; returns the process exit status."""
  export_dir = flag_values["export_dir"].value
  try:
    config, checkpoint = assemble.prepare_export(
        flag_values["model_dir"].value, export_dir, report=loop.say)
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    return cli.fail(PROGRAM, str(e), cli.EXIT_USAGE)
  try:
    path = saved_model.export_saved_model(estimator, export_dir, checkpoint_path=checkpoint)
  except Exception as e:
    # The version is staged under a non-numeric name that export_saved_model
    # removes on any error: nothing half-written is left looking complete.
    failure = cli.storage_failure(e, export_dir, "--export_dir",
                                  checkpoints.checkpoint_bytes(checkpoint))
    if failure is None:
      raise
    message, status = failure
    return cli.fail(PROGRAM, f"{message}; no version was left in --export_dir: free space, then "
                    "run the same command", status)
  loop.say(f"exported {checkpoint} to {path}")
  return 0


def main():
  """The `export.py` / `estimator-tpu-export` command."""
  cli.quiet_tensorflow()
  flags_lib.define_flags()
  app.run(cli.make_main(PROGRAM, run, FLAGS))


if __name__ == "__main__":
  main()
