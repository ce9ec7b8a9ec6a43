"""Export the latest checkpoint in --model_dir as a SavedModel for CPU/GPU serving.

    python export.py --model_dir=MODEL --export_dir=EXPORT

The model is rebuilt from MODEL/config.json; no model flags need retyping.
"""

import os
import sys

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from estimator_tpu import config as config_lib
from estimator_tpu import export_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import loop
from estimator_tpu import runner

FLAGS = flags.FLAGS


def run(flag_values):
  """Exports; returns the process exit status."""
  try:
    config, checkpoint = runner.prepare_export(
        flag_values["model_dir"].value, flag_values["export_dir"].value)
    estimator = runner.build(config)
  except config_lib.ConfigError as e:
    print(f"export.py: error: {e}", file=sys.stderr)
    return 2
  path = export_lib.export_saved_model(estimator, flag_values["export_dir"].value,
                                       config.data.image_size, checkpoint_path=checkpoint)
  loop.say(f"exported {checkpoint} to {path}")
  return 0


if __name__ == "__main__":
  runner.quiet_tensorflow()
  flags_lib.define_flags()
  app.run(runner.make_main("export.py", run, FLAGS))
