"""What every entry point shares: TensorFlow kept quiet, and absl's main with argument checks."""

import logging
import sys

import tensorflow as tf

from estimator_tpu import storage

EXIT_USAGE = 2
# sysexits.h: EX_IOERR (the user must act: free space) and EX_TEMPFAIL
# ("temporary failure; the user is invited to retry": preemption, storage
# errors that persisted through the retries). Schedulers can match 75.
EXIT_NO_SPACE = 74
EXIT_RETRY = 75


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


def storage_failure(error, directory, flag, needed_bytes=None):
  """(message, exit status) for a full disk or a storage error that persisted, else None.

  Args:
    error: what the run raised.
    directory: where it was writing.
    flag: the flag that named directory ("--model_dir").
    needed_bytes: about how much the write that failed needed, if known.
  """
  if storage.no_space(error):
    return storage.no_space_message(directory, flag, needed_bytes), EXIT_NO_SPACE
  if isinstance(error, storage.StorageError):
    return str(error), EXIT_RETRY
  cause = storage.transient_cause(error)
  if cause is not None:
    return (f"storage error under {flag}={directory} that persisted through TensorFlow's "
            f"retries ({type(cause).__name__}: {storage.first_line(cause)}); run the same "
            "command again", EXIT_RETRY)
  return None


def fail(program, message, status):
  """Prints `program: error: message` on stderr; returns status."""
  print(f"{program}: error: {message}", file=sys.stderr)
  return status
