"""Reading a data directory: file patterns, class names and example counts (a DataInfo).

Reads preprocess.py's layout (train-*/validation-* shards, labels.txt,
manifest.json) and tensorflow/tpu's jpeg_to_tf_record.py layout (the same
shards with no manifest; the eval set is then counted from the records).
A folder where a preprocess.py run stopped (its temporary folder, no
manifest) is refused, with the command that finishes it.
"""

import dataclasses
import json
import os

import tensorflow as tf

from estimator_tpu import storage
from estimator_tpu.config import ConfigError
from estimator_tpu.data import layout


@dataclasses.dataclass(frozen=True)
class DataInfo:
  train_pattern: str
  eval_pattern: str
  class_names: tuple
  num_classes: int
  num_train_examples: int
  num_eval_examples: int


def read_labels(path):
  """Class names, one per line in label order; blank lines ignored."""
  if not storage.exists(path):
    raise ConfigError(f"labels file {path} does not exist")
  text = storage.read_text(path)
  try:
    return layout.parse_labels(text, f"labels file {path}")
  except ValueError as e:
    raise ConfigError(str(e)) from e


def count_records(pattern):
  """Number of records in the TFRecord files matching pattern (reads them all)."""
  dataset = tf.data.TFRecordDataset(tf.io.gfile.glob(pattern))
  return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _require_files(pattern, flag):
  if not tf.io.gfile.glob(pattern):
    raise ConfigError(f"{flag}: no files match {pattern}")


def _check_finished(directory, flag):
  """Refuses a folder that a preprocess.py run stopped in (its temporary folder, no manifest).

  Its shards may be partial or missing: training on them would silently use
  part of the data.
  """
  if storage.exists(os.path.join(directory, layout.MANIFEST_FILE)):
    return
  temp_dirs = sorted(tf.io.gfile.glob(os.path.join(directory, layout.TEMP_DIR_PREFIX + "*")))
  if not temp_dirs:
    return
  command_file = os.path.join(temp_dirs[-1], layout.COMMAND_FILE)
  command = storage.read_text(command_file).strip() if storage.exists(command_file) else ""
  finish = (f"finish it with the command that started it: {command}" if command else
            f"run the preprocess.py command that wrote it again (--output_dir={directory})")
  raise ConfigError(
      f"{flag} holds the output of a preprocess.py run that stopped before it finished "
      f"({os.path.basename(temp_dirs[-1].rstrip('/'))}/, no {layout.MANIFEST_FILE}); {finish}")


def _read_manifest(data_dir):
  path = os.path.join(data_dir, layout.MANIFEST_FILE) if data_dir else ""
  if not path or not storage.exists(path):
    return None
  try:
    return json.loads(storage.read_text(path))
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path} is not valid JSON: {e}") from e


def _class_names(data, manifest):
  labels_path = data.labels_file or (
      os.path.join(data.data_dir, layout.LABELS_FILE) if data.data_dir else "")
  names = None
  if labels_path and tf.io.gfile.exists(labels_path):
    names = read_labels(labels_path)
  elif data.labels_file:
    raise ConfigError(f"--labels_file={data.labels_file} does not exist")
  if names and manifest and manifest.get("labels") is not None:
    if tuple(manifest["labels"]) != names:
      raise ConfigError(
          f"{labels_path} ({len(names)} classes) disagrees with "
          f"{os.path.join(data.data_dir, layout.MANIFEST_FILE)} "
          f"({len(manifest['labels'])} classes); re-run preprocess.py or fix the file")
  if names and data.num_label_classes and data.num_label_classes != len(names):
    raise ConfigError(
        f"--num_label_classes={data.num_label_classes} disagrees with the "
        f"{len(names)} classes in {labels_path}")
  if not names and not data.num_label_classes:
    raise ConfigError(
        f"no labels.txt in --data_dir={data.data_dir or '(unset)'}: "
        "give --labels_file or --num_label_classes")
  return names


def resolve(data, need_train=True, need_eval=True):
  """Resolves a DataConfig against the files on disk.

  Args:
    data: the DataConfig (flags --data_dir, --train_data, --eval_data, ...).
    need_train: the run trains: training files must exist.
    need_eval: the run evaluates: evaluation files must exist.

  Returns:
    A DataInfo.

  Raises:
    ConfigError: naming the flag and the value when something is missing.
  """
  if not data.data_dir and not (data.train_data or data.eval_data):
    raise ConfigError("give --data_dir (a preprocess.py output directory) "
                      "or --train_data and --eval_data file patterns")
  if data.data_dir and not tf.io.gfile.isdir(data.data_dir):
    raise ConfigError(f"--data_dir={data.data_dir} is not a directory")
  if data.data_dir:
    _check_finished(data.data_dir, f"--data_dir={data.data_dir}")
  for flag, pattern in (("--train_data", data.train_data), ("--eval_data", data.eval_data)):
    folder = os.path.dirname(pattern or "")
    if folder and not any(c in folder for c in "*?[") and tf.io.gfile.isdir(folder):
      _check_finished(folder, f"{flag}={pattern}: its folder {folder}")
  train = data.train_data or os.path.join(data.data_dir, layout.TRAIN_GLOB)
  evaluation = data.eval_data or os.path.join(data.data_dir, layout.EVAL_GLOB)
  if need_train:
    _require_files(train, "--train_data" if data.train_data else f"--data_dir={data.data_dir}")
  if need_eval:
    _require_files(evaluation, "--eval_data" if data.eval_data else f"--data_dir={data.data_dir}")
  manifest = _read_manifest(data.data_dir)
  names = _class_names(data, manifest)
  splits = (manifest or {}).get("splits", {})
  num_eval = data.num_eval_examples
  if need_eval and not num_eval:
    if not data.eval_data and layout.VALIDATION in splits:
      num_eval = int(splits[layout.VALIDATION]["count"])
    else:
      num_eval = count_records(evaluation)
  if need_eval and num_eval <= 0:
    raise ConfigError(f"the evaluation files {evaluation} hold no records")
  num_train = int(splits.get(layout.TRAIN, {}).get("count", 0)) if not data.train_data else 0
  return DataInfo(
      train_pattern=train, eval_pattern=evaluation,
      class_names=names or (), num_classes=len(names) if names else data.num_label_classes,
      num_train_examples=num_train, num_eval_examples=num_eval)
