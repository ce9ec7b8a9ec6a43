"""What every entry point shares: TensorFlow kept quiet, and absl's main with argument checks."""

import logging
import sys

import tensorflow as tf


def quiet_tensorflow():
  """Keeps TF's and absl's INFO chatter out of what the user reads.

  TF's C++ logs obey TF_CPP_MIN_LOG_LEVEL, which entry points set before
  importing TensorFlow.
  """
  tf.get_logger().setLevel(logging.ERROR)
  logging.getLogger("estimator_tpu").setLevel(logging.WARNING)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)


def make_main(program, run, flag_values):
  """absl's main(argv) for an entry point: stray arguments are an error (exit 2)."""

  def main(argv):
    if len(argv) > 1:
      print(f"{program}: error: unexpected arguments {argv[1:]}", file=sys.stderr)
      return 2
    return run(flag_values)

  return main
