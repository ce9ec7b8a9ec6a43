"""Export the latest checkpoint in --model_dir as a SavedModel for CPU/GPU serving.

The `export.py` / `estimator-tpu-export` command:

    python export.py --model_dir=MODEL --export_dir=EXPORT

The model is rebuilt from MODEL/config.json; no model flags need retyping.
A checkpoint already exported to EXPORT is not published again: the command
says which version holds it.
"""

import os

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app
from absl import flags

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu.cli import parsing

# TensorFlow loads with these, after the flags are parsed (--help answers at once).
saved_model = cli.lazy_import("estimator_tpu.export.saved_model")
versions = cli.lazy_import("estimator_tpu.export.versions")
assemble = cli.lazy_import("estimator_tpu.run.assemble")
checkpoints = cli.lazy_import("estimator_tpu.run.checkpoints")
loop = cli.lazy_import("estimator_tpu.run.loop")

FLAGS = flags.FLAGS
PROGRAM = "export.py"


def define_flags(flag_values=FLAGS):
  """export.py's flags: the rest comes from --model_dir's config.json."""
  flags.DEFINE_string("model_dir", None, "The trained model's directory (its config.json and "
                      "newest checkpoint; local or gs://).", flag_values=flag_values)
  flags.DEFINE_string("export_dir", None, "Where the SavedModel's numeric version "
                      "directories go (TF Serving's base path).", flag_values=flag_values)


def run(flag_values):
  """Exports; returns the process exit status."""
  export_dir = flag_values["export_dir"].value
  try:
    config, checkpoint = assemble.prepare_export(
        flag_values["model_dir"].value, export_dir, report=loop.say)
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    return cli.fail(PROGRAM, str(e), cli.EXIT_USAGE)
  found = saved_model.find_export(estimator, export_dir, checkpoint_path=checkpoint)
  if found:
    loop.say(f"{checkpoint} is already exported to {export_dir} as "
             f"{versions.served_line(export_dir, found)}; no new version published")
    return 0
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
  global PROGRAM
  PROGRAM = program = cli.program_name(PROGRAM)
  define_flags()
  app.run(cli.make_main(program, run, FLAGS),
          flags_parser=parsing.flags_parser(program, __doc__, [
              ("Flags", ["model_dir", "export_dir"])]))


if __name__ == "__main__":
  main()
