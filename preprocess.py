"""Turns labelled images into train/validation TFRecord shards with Apache Beam.

  python preprocess.py --input_dir=IMAGES --output_dir=DATA [Beam options]
  python preprocess.py --input_csv=FILES.csv [--labels_file=L] --output_dir=DATA

Writes DATA/{train,validation}-NNNNN-of-NNNNN.tfrecord, labels.txt,
rejected.csv and, last, manifest.json. Any argument that is not a flag below
is a Beam pipeline option (--runner, --direct_num_workers, Dataflow, ...).
See docs/PREPROCESS.md.
"""

import contextlib
import io
import json
import logging as std_logging
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TF start-up chatter.
std_logging.getLogger().setLevel(std_logging.ERROR)  # Beam's import chatter.

from absl import app
from absl import flags
from absl import logging
from apache_beam.io.filesystems import FileSystems

from estimator_tpu import storage
from estimator_tpu.beam import options as preprocess_flags
from estimator_tpu.beam import package
from estimator_tpu.beam import sources
from estimator_tpu.data import layout

FLAGS = flags.FLAGS
PROG = "preprocess.py"


def _fail(message):
  print(f"{PROG}: error: {message}", file=sys.stderr)
  return 2


def _parse(argv):
  preprocess_flags.define_flags()
  try:
    return FLAGS(argv, known_only=True)
  except flags.Error as e:
    sys.exit(_fail(str(e)))


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
  # Imported only now: TensorFlow takes seconds, flag errors should not wait.
  import apache_beam as beam

  from estimator_tpu.beam import pipeline as beam_pipeline
  with tempfile.TemporaryDirectory(prefix="preprocess-dist-") as dist_dir:
    options = beam.options.pipeline_options.PipelineOptions(
        _beam_args(pipeline_args, dist_dir))
    with beam.Pipeline(options=options) as p:
      beam_pipeline.build_pipeline(p, plan)
  path = FileSystems.join(plan.output_dir, layout.MANIFEST_FILE)
  with FileSystems.open(path) as f:
    return json.loads(f.read().decode("utf-8"))


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


def run(argv):
  pipeline_args = argv[1:]
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
    existed = sources.check_output_dir(
        FLAGS.output_dir, FLAGS.overwrite, FLAGS.input_dir)
  except sources.InputError as e:
    return _fail(str(e))
  held = io.StringIO()
  try:
    with _held_back(held):
      manifest = _run_pipeline(plan, pipeline_args)
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
  app.run(run, flags_parser=_parse)


if __name__ == "__main__":
  main()
