"""Turns labelled images into train/validation TFRecord shards with Apache Beam.

  python preprocess.py --input_dir=IMAGES --output_dir=DATA [Beam options]
  python preprocess.py --input_csv=FILES.csv [--labels_file=L] --output_dir=DATA

Writes DATA/{train,validation}-NNNNN-of-NNNNN.tfrecord, labels.txt,
rejected.csv and, last, manifest.json. Any argument that is not a flag below
is a Beam pipeline option (--runner, --direct_num_workers, Dataflow, ...).
See docs/PREPROCESS.md.
"""

import json
import logging as std_logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TF start-up chatter.
std_logging.getLogger().setLevel(std_logging.ERROR)  # Beam's import chatter.

from absl import app
from absl import flags
from absl import logging
from apache_beam.io.filesystems import FileSystems

from estimator_tpu.beam import options as preprocess_flags
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


def _run_pipeline(plan, pipeline_args):
  """Runs Beam and returns the manifest it wrote."""
  # Imported only now: TensorFlow takes seconds, flag errors should not wait.
  import apache_beam as beam

  from estimator_tpu.beam import pipeline as beam_pipeline
  options = beam.options.pipeline_options.PipelineOptions(
      preprocess_flags.with_defaults(pipeline_args))
  with beam.Pipeline(options=options) as p:
    beam_pipeline.build_pipeline(p, plan)
  path = FileSystems.join(plan.output_dir, layout.MANIFEST_FILE)
  with FileSystems.open(path) as f:
    return json.loads(f.read().decode("utf-8"))


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
  manifest = _run_pipeline(plan, pipeline_args)
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
