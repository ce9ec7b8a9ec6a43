"""Turns labelled images into train/validation TFRecord shards with Apache Beam.

The `preprocess.py` / `estimator-tpu-preprocess` command:

  python preprocess.py --input_dir=IMAGES --output_dir=DATA [Beam options]
  python preprocess.py --input_csv=FILES.csv [--labels_file=L] --output_dir=DATA

Writes DATA/{train,validation}-NNNNN-of-NNNNN.tfrecord, labels.txt,
rejected.csv and, last, manifest.json. Any argument that is not a flag below
is a Beam pipeline option (--runner, --direct_num_workers, Dataflow, ...).
Ctrl-C or SIGTERM stops it with one line and exit status 75; the same
command then starts again (what the stopped run wrote has no manifest.json
and is removed first). See docs/PREPROCESS.md.
"""

import contextlib
import dataclasses
import io
import json
import logging as std_logging
import os
import shlex
import signal
import sys
import tempfile
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TF start-up chatter.
std_logging.getLogger().setLevel(std_logging.ERROR)  # Beam's import chatter.

from absl import app
from absl import flags
from absl import logging

from estimator_tpu import cli
from estimator_tpu import progress
from estimator_tpu.beam import options as preprocess_flags
from estimator_tpu.cli import parsing

# Beam and TensorFlow load with these, after the flags are parsed.
storage = cli.lazy_import("estimator_tpu.storage")
package = cli.lazy_import("estimator_tpu.beam.package")
sources = cli.lazy_import("estimator_tpu.beam.sources")
tally = cli.lazy_import("estimator_tpu.beam.tally")
layout = cli.lazy_import("estimator_tpu.data.layout")

FLAGS = flags.FLAGS
PROG = "preprocess.py"
_BEAM_HELP = """Beam pipeline options: any other --flag (--runner, --direct_num_workers, Dataflow's
--project/--region/--temp_location, --runner=DaskRunner --dask_client_address=...); without
--runner, Beam's DirectRunner on every local core. docs/PREPROCESS.md has the runners."""


class Interrupted(BaseException):
  """Ctrl-C or SIGTERM arrived while the pipeline ran (a BaseException, as KeyboardInterrupt:
  Beam's `except Exception` must not catch it)."""

  def __init__(self, signal_name):
    super().__init__(signal_name)
    self.signal_name = signal_name


def _fail(message):
  return cli.fail(PROG, message, cli.EXIT_USAGE)


def _parse(argv):
  preprocess_flags.define_flags()
  parse = parsing.flags_parser(PROG, __doc__, [("Flags", list(preprocess_flags.FLAG_NAMES))],
                               known_only=True, more_help=_BEAM_HELP)
  return parse(argv)


_RESEND_SECS = 0.05  # a signal lost where exceptions are ignored is sent again after this


@contextlib.contextmanager
def _interruptible():
  """Turns SIGINT and SIGTERM into Interrupted, raised in the main thread.

  A signal that arrives while the main thread runs code whose exceptions
  Python ignores (a weakref callback, a __del__: it would print "Exception
  ignored in ..." and go on) is sent again a moment later, from another
  thread, once that code has returned: Interrupted is raised where the
  program runs instead of being lost while the pipeline runs to its end.
  """
  resent = []

  def handler(signum, frame):
    del frame
    raise Interrupted(signal.Signals(signum).name)

  def unraisable(info):
    if not isinstance(info.exc_value, Interrupted):
      return unraisable_before(info)
    timer = threading.Timer(_RESEND_SECS, os.kill,
                            (os.getpid(), signal.Signals[info.exc_value.signal_name]))
    timer.daemon = True
    resent.append(timer)
    timer.start()
    return None

  unraisable_before, sys.unraisablehook = sys.unraisablehook, unraisable
  previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for timer in resent:
      timer.cancel()
    for sig, old in previous.items():
      signal.signal(sig, old)
    sys.unraisablehook = unraisable_before


def _stopped_line(signal_name, output_dir):
  what = "interrupted (Ctrl-C)" if signal_name == "SIGINT" else f"preempted ({signal_name})"
  return (f"{PROG}: {what}; --output_dir={output_dir} holds no dataset yet (no "
          f"{layout.MANIFEST_FILE}): run the same command to start again")


def _typed_command():
  """The command line as the user typed it (`python preprocess.py ...` or the installed one)."""
  program = f"python {PROG}" if PROG.endswith(".py") else PROG
  return " ".join([program, *(shlex.quote(arg) for arg in sys.argv[1:])])


def _beam_args(pipeline_args, dist_dir):
  """The args Beam gets; with a remote runner, the package's wheel for its workers."""
  args = preprocess_flags.with_defaults(pipeline_args)
  if package.needs_package(args):
    wheel = package.build_wheel(dist_dir)
    args.append(f"--extra_package={wheel}")
    print(f"{PROG}: workers get this package as {os.path.basename(wheel)}, built from "
          f"{package.project_root()}/pyproject.toml (--extra_package)", flush=True)
  return args


def _run_pipeline(plan, pipeline_args):
  """Runs Beam and returns the manifest it wrote."""
  import apache_beam as beam
  from apache_beam.io.filesystems import FileSystems

  from estimator_tpu.beam import pipeline as beam_pipeline
  with tempfile.TemporaryDirectory(prefix="preprocess-dist-") as dist_dir:
    options = beam.options.pipeline_options.PipelineOptions(
        _beam_args(pipeline_args, dist_dir))
    with _shown_progress(len(plan.items), pipeline_args), beam.Pipeline(options=options) as p:
      beam_pipeline.build_pipeline(p, plan)
  path = FileSystems.join(plan.output_dir, layout.MANIFEST_FILE)
  with FileSystems.open(path) as f:
    return json.loads(f.read().decode("utf-8"))


def _plain_line(done, total, rate, secs_left, details):
  left = f" | {progress.duration(secs_left)} left" if secs_left is not None else ""
  return f"{PROG}: {done:,}/{total:,} images | {details} | {rate:.0f} images/s{left}"


@contextlib.contextmanager
def _shown_progress(total, pipeline_args, every_secs=0.5):
  """Shows images encoded and rejected while the pipeline runs (DoFns in this process only)."""
  if preprocess_flags.runner_name(pipeline_args) not in (None, "DirectRunner") or any(
      arg.startswith("--direct_running_mode") and "multi_processing" in arg
      for arg in pipeline_args):
    yield  # the workers count in their own processes: the runner's own page shows them
    return
  tally.reset()
  done = threading.Event()
  shown = progress.Progress(total, "images", _plain_line, stream=sys.stderr,
                            say=lambda line: print(line, flush=True))

  def show():
    while not done.wait(every_secs):
      encoded, rejected = tally.read()
      shown.update(encoded + rejected, f"{encoded:,} encoded, {rejected:,} rejected")

  thread = threading.Thread(target=show, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()
    shown.close()


@contextlib.contextmanager
def _held_back(buffer):
  """Holds Beam's stderr output and log records in buffer while the pipeline runs.

  Beam's local workers print and log each failed bundle's traceback before
  the pipeline raises the same error. The caller shows what was held unless
  the error is a full disk, which gets its one line instead.
  """
  beam_logger = std_logging.getLogger("apache_beam")
  handler = std_logging.StreamHandler(buffer)
  propagate = beam_logger.propagate
  beam_logger.addHandler(handler)
  beam_logger.propagate = False
  try:
    with contextlib.redirect_stderr(buffer):
      yield
  finally:
    beam_logger.removeHandler(handler)
    beam_logger.propagate = propagate


def _input_bytes(plan, sample=1000):
  """About how many bytes the inputs take (the first `sample` local files, scaled up)."""
  paths = [item.path for item in plan.items[:sample] if os.path.exists(item.path)]
  if not paths:
    return 0
  return sum(os.path.getsize(p) for p in paths) * len(plan.items) // len(paths)


def _summary(manifest, output_dir):
  lines = ["", "=" * 60, f"{PROG}: done"]
  for split, info in manifest["splits"].items():
    lines.append(f"  {split:<11} {info['count']:>9,} images in "
                 f"{len(info['shards'])} shard(s)")
  rejected = manifest["rejected"]
  lines.append(f"  {'rejected':<11} {rejected['count']:>9,}"
               + (f"  (see {rejected['file']})" if rejected["count"] else ""))
  return "\n".join(lines + [f"  output      {output_dir}", "=" * 60])


def _import_beam_quietly():
  """Imports Beam with its import-time warnings (apitools, bigquery) left unsaid."""
  root = std_logging.getLogger()
  level = root.level
  root.setLevel(std_logging.ERROR)
  try:
    import apache_beam  # noqa: F401
  finally:
    root.setLevel(level)


def run(argv):
  pipeline_args = argv[1:]
  _import_beam_quietly()
  problems = preprocess_flags.unknown_args(pipeline_args)
  if problems:
    return _fail(problems[0])
  logging.set_verbosity(logging.WARNING)
  std_logging.getLogger().setLevel(std_logging.WARNING)
  try:
    plan = sources.make_plan(
        FLAGS.output_dir, FLAGS.input_dir, FLAGS.input_csv, FLAGS.labels_file,
        FLAGS.validation_fraction, FLAGS.num_shards, FLAGS.max_size,
        preprocess_flags.settings(FLAGS, pipeline_args))
    plan = dataclasses.replace(plan, command=_typed_command())
    existed = sources.check_output_dir(
        FLAGS.output_dir, FLAGS.overwrite, FLAGS.input_dir,
        report=lambda line: print(f"{PROG}: {line}", flush=True))
  except sources.InputError as e:
    return _fail(str(e))
  held = io.StringIO()
  try:
    with _interruptible(), _held_back(held):
      manifest = _run_pipeline(plan, pipeline_args)
  except Interrupted as e:
    print(_stopped_line(e.signal_name, plan.output_dir), flush=True)
    cli.exit_now(cli.EXIT_RETRY)  # Beam's threads stop with the process
  except package.PackageError as e:  # Raised before the pipeline wrote anything.
    return _fail(str(e))
  except Exception as e:
    if not storage.no_space(e):
      sys.stderr.write(held.getvalue())
      raise
    # What this run wrote is removed: the space is freed and no part of the
    # dataset is left (there is no manifest.json, so it never looked complete).
    sources.remove_dataset(plan.output_dir, remove_dir=not existed)
    return _fail(storage.no_space_message(plan.output_dir, "--output_dir",
                                          2 * _input_bytes(plan)) +
                 "; nothing was kept: free space, then run the same command")
  sys.stderr.write(held.getvalue())
  if manifest["images"]["count"] == 0:
    sources.remove_dataset(plan.output_dir, remove_dir=not existed)
    return _fail(f"no valid image among {manifest['inputs']} inputs "
                 f"({manifest['rejected']['by_reason']}); nothing written")
  print(_summary(manifest, plan.output_dir))
  return 0


def main():
  """The `preprocess.py` / `estimator-tpu-preprocess` command."""
  global PROG
  PROG = cli.program_name(PROG)
  app.run(run, flags_parser=_parse)


if __name__ == "__main__":
  main()
