"""preprocess.py's flags: define_flags(), and the Beam options it passes on."""

import difflib
import importlib
import logging

from absl import flags

# Without any of these, the DirectRunner uses every core. Threads, not
# processes: PIL decodes with the GIL released, while each worker process
# pays TensorFlow's import (2 cores, 10,000 images: processes took 2-3x as
# long as threads; see docs/PREPROCESS.md).
_RUNNER_FLAGS = ("--runner", "--direct_num_workers", "--direct_running_mode")
_LOG_LEVEL_FLAG = "--default_sdk_harness_log_level"
DEFAULT_DIRECT_ARGS = ("--direct_num_workers=0",
                       "--direct_running_mode=multi_threading")

# Beam knows these runners only by their module path, and registers their
# options only when that module is imported.
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
SHORT_RUNNER_NAMES = {"DaskRunner": DASK_RUNNER}
_DASK_PREFIX = "--dask_"
_DASK_PARTITION_FLAGS = ("--dask_npartitions", "--dask_partition_size")
# The chunks in 8 Dask tasks (Beam's default puts 128 chunks, 8,192 images, in
# one task, so a small dataset runs on one worker). Each task costs a fixed
# ~0.2 s: 3,000 images on 2 workers ran at 160 images/s with one chunk per
# task, 249 with 16 tasks and 302 with 8. Bigger clusters: --dask_npartitions.
DEFAULT_DASK_ARGS = ("--dask_npartitions=8",)


def runner_name(args):
  """The --runner value in args (`--runner=X` or `--runner X`), or None."""
  args = list(args)
  name = None
  for i, arg in enumerate(args):
    if arg.startswith("--runner="):
      name = arg.split("=", 1)[1]
    elif arg == "--runner" and i + 1 < len(args):
      name = args[i + 1]
  return name


def is_dask(args):
  """Whether args ask for Beam's DaskRunner, by its short name or its path."""
  name = runner_name(args)
  return SHORT_RUNNER_NAMES.get(name, name) == DASK_RUNNER


def _with_full_runner_name(args):
  """args with a short runner name that Beam does not know replaced by its path."""
  out = []
  for i, arg in enumerate(args):
    if arg.startswith("--runner=") and arg[9:] in SHORT_RUNNER_NAMES:
      arg = "--runner=" + SHORT_RUNNER_NAMES[arg[9:]]
    elif i and args[i - 1] == "--runner" and arg in SHORT_RUNNER_NAMES:
      arg = SHORT_RUNNER_NAMES[arg]
    out.append(arg)
  return out


def _runner_option_problems(args):
  """Imports the Dask runner's options when asked for; messages if that cannot be."""
  dask_flags = [a.split("=", 1)[0] for a in args if a.startswith(_DASK_PREFIX)]
  if not is_dask(args):
    return [f"{flag} is an option of the DaskRunner; add --runner=DaskRunner"
            for flag in dask_flags]
  try:
    importlib.import_module(DASK_RUNNER.rsplit(".", 1)[0])
  except ImportError as e:
    return [f"--runner={runner_name(args)} needs dask[distributed] ({e}); "
            "install it with pip install 'apache-beam[dask]'"]
  return []


def define_flags(flag_values=flags.FLAGS):
  """Defines preprocess.py's flags on flag_values (call once, in main)."""
  flags.DEFINE_string("input_dir", None, "Folder of class sub-folders of "
                      "images (local or gs://).", flag_values=flag_values)
  flags.DEFINE_string("input_csv", None, "CSV of `path,label` rows; relative "
                      "paths are relative to the CSV.", flag_values=flag_values)
  flags.DEFINE_string("labels_file", None, "Class names, one per line, in "
                      "label order. Default: the sorted class names found.",
                      flag_values=flag_values)
  flags.DEFINE_string("output_dir", None, "Where the shards, labels.txt, "
                      "rejected.csv and manifest.json go.",
                      flag_values=flag_values)
  flags.DEFINE_float("validation_fraction", 0.1, "Fraction of each class "
                     "held out for validation (0 <= f < 1).",
                     flag_values=flag_values)
  flags.DEFINE_integer("num_shards", None, "Shards per split. Default: about "
                       "100 MB per shard, at least 1.", flag_values=flag_values)
  flags.DEFINE_integer("max_size", None, "Downsize images whose long side is "
                       "larger to this many pixels.", flag_values=flag_values)
  flags.DEFINE_bool("overwrite", False, "Replace a dataset already in "
                    "--output_dir.", flag_values=flag_values)


FLAG_NAMES = ("input_dir", "input_csv", "labels_file", "output_dir", "validation_fraction",
              "num_shards", "max_size", "overwrite")


def settings(flag_values=flags.FLAGS, pipeline_args=()):
  """The flags used, as recorded in manifest.json."""
  used = {name: flag_values[name].value for name in FLAG_NAMES}
  used["pipeline_args"] = list(pipeline_args)
  return used


def unknown_args(args, flag_values=flags.FLAGS):
  """Error messages for args that are neither our flags nor Beam options."""
  problems = _runner_option_problems(list(args))
  if problems:
    return problems
  # Imported only now: Beam takes a second or two, --help and our own flags' errors do not wait.
  from apache_beam.options.pipeline_options import PipelineOptions
  parsers = []
  # Beam would log the unknown ones too; we report them as errors instead.
  beam_logger = logging.getLogger(PipelineOptions.__module__)
  level = beam_logger.level
  beam_logger.setLevel(logging.ERROR)
  try:
    PipelineOptions(list(args)).get_all_options(
        add_extra_args_fn=parsers.append)
  finally:
    beam_logger.setLevel(level)
  _, unknown = parsers[0].parse_known_args(list(args))
  actions = parsers[0]._actions
  known = [f"--{name}" for name in flag_values] + [
      option for action in actions for option in action.option_strings]
  messages = []
  for arg in unknown:
    name = arg.split("=", 1)[0]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    messages.append(f"unknown flag {name}: neither a preprocess.py flag nor "
                    f"a Beam pipeline option{hint}")
  return messages


def _given(args, names):
  return any(arg.split("=", 1)[0] in names for arg in args)


def with_defaults(args):
  """args for Beam: quiet workers; unless a runner is set, all-cores Direct.

  A short runner name Beam does not know (DaskRunner) becomes its module
  path; the DaskRunner gets DEFAULT_DASK_ARGS unless partitions are given.
  """
  args = _with_full_runner_name(list(args))
  if not _given(args, (_LOG_LEVEL_FLAG,)):
    args.append(f"{_LOG_LEVEL_FLAG}=ERROR")  # Beam's start-up chatter.
  if not _given(args, _RUNNER_FLAGS):
    args.extend(DEFAULT_DIRECT_ARGS)
  if is_dask(args) and not _given(args, _DASK_PARTITION_FLAGS):
    args.extend(DEFAULT_DASK_ARGS)
  return args
