"""The commands (train, export, preprocess) and what they share: exit codes, TF kept quiet.

Nothing here imports TensorFlow: a command parses its flags first, so that
--help and a misspelt flag answer at once.
"""

import importlib.util
import logging
import os
import sys

EXIT_USAGE = 2
# sysexits.h: EX_IOERR (the user must act: free space) and EX_TEMPFAIL
# ("temporary failure; the user is invited to retry": preemption, storage
# errors that persisted through the retries). Schedulers can match 75.
EXIT_NO_SPACE = 74
EXIT_RETRY = 75


def lazy_import(name):
  """The module `name`, loaded on its first attribute use (importlib.util.LazyLoader).

  A command names its library modules at its top, as usual, yet TensorFlow
  loads only once the flags are parsed and the command runs.
  """
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  loader = importlib.util.LazyLoader(spec.loader)
  spec.loader = loader
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  loader.exec_module(module)
  return module


def quiet_tensorflow():
  """Keeps TF's and absl's INFO chatter out of what the user reads.

  TF's C++ logs obey TF_CPP_MIN_LOG_LEVEL, which entry points set before
  importing TensorFlow; the lines TF writes before that applies are kept off
  stderr by estimator_tpu.tf_startup. A TF record that does get through (an
  ERROR) prints once.
  """
  from estimator_tpu import tf_logger
  tf_logger.print_once().setLevel(logging.ERROR)
  logging.getLogger("estimator_tpu").setLevel(logging.WARNING)
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)


def make_main(program, run, flag_values):
  """absl's main(argv) for an entry point: stray arguments are an error (exit 2)."""

  def main(argv):
    if len(argv) > 1:
      return fail(program, f"unexpected arguments {argv[1:]}: every option is a --flag; "
                  f"{program} --help lists them", EXIT_USAGE)
    quiet_tensorflow()
    return run(flag_values)

  return main


def exit_now(status):
  """Ends the process with status at once, once its output is flushed.

  For a stop on a signal, which a VM follows with a kill ~30 s later: by now
  what the resume needs is on disk, and closing the session (tf.data's
  threads) and TensorFlow's teardown can take seconds of that. Pending
  summary events are written first.
  """
  from tensorflow.python.summary.writer import writer_cache
  writer_cache.FileWriterCache.clear()  # flushes and closes the cached event writers
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  os._exit(status)


def storage_failure(error, directory, flag, needed_bytes=None):
  """(message, exit status) for a full disk or a storage error that persisted, else None.

  Args:
    error: what the run raised.
    directory: where it was writing.
    flag: the flag that named directory ("--model_dir").
    needed_bytes: about how much the write that failed needed, if known.
  """
  from estimator_tpu import storage
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


def program_name(script):
  """What the user typed to run a command: `script` (train.py) or the installed command's name.

  Args:
    script: the name of the command's script in the repository (train.py), also
      what `python -m estimator_tpu.cli.train` is called.
  """
  called = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  if not called or called.endswith(".py") or called in ("-c", "-m"):
    return script
  return called


def fail(program, message, status):
  """Prints `program: error: message` on stderr; returns status."""
  print(f"{program}: error: {message}", file=sys.stderr)
  return status
