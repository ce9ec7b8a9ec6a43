"""Which version of an export dir holds which model: the record each version keeps.

Every version export_saved_model publishes keeps, in assets.extra/ (files TF
Serving leaves alone), what it was made from: a digest of the checkpoint's
.index file (which lists every variable with its size and checksum, so two
checkpoints with the same values have the same digest) and the settings
serving depends on. Re-running an export of the same checkpoint finds that
version instead of publishing an identical one, which TF Serving would load
again.
"""

import hashlib
import json
import os

import tensorflow as tf

from estimator_tpu.export import contract

SOURCE_FILE = "export_source.json"
# What makes two exports the same model for a client, besides the checkpoint.
SERVING_KEYS = ("image_size", "eval_crop", "eval_crop_form", "class_names")


def source_record(checkpoint_path, params):
  """The record of an export of checkpoint_path with the run's params (a JSON-able dict)."""
  with tf.io.gfile.GFile(checkpoint_path + ".index", "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  record = {"checkpoint": checkpoint_path, "checkpoint_index_sha256": digest}
  for key in SERVING_KEYS:
    value = params.get(key)
    record[key] = list(value) if isinstance(value, (list, tuple)) else value
  return record


def write_record(version_dir, record):
  """Writes record into a (staged) version dir."""
  directory = os.path.join(version_dir, contract.ASSETS_EXTRA)
  tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(os.path.join(directory, SOURCE_FILE), "w") as f:
    f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_record(version_dir):
  """The record a version keeps, or None (an export from before records, or unreadable)."""
  path = os.path.join(version_dir, contract.ASSETS_EXTRA, SOURCE_FILE)
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.loads(f.read())
  except (tf.errors.NotFoundError, ValueError):
    return None


def numeric_versions(export_dir):
  """The numeric version names under export_dir, oldest first."""
  if not tf.io.gfile.isdir(export_dir):
    return []
  names = [name.rstrip("/") for name in tf.io.gfile.listdir(export_dir)]
  return sorted((name for name in names if name.isdigit()), key=int)


def find(export_dir, record):
  """The version dir under export_dir that holds the model `record` describes, or None.

  The checkpoint's path may differ (a model dir copied or moved); its digest
  and the serving settings may not.
  """
  def same(other):
    return other is not None and all(
        other.get(key) == record[key] for key in record if key != "checkpoint")

  for name in reversed(numeric_versions(export_dir)):
    version_dir = os.path.join(export_dir, name)
    if same(read_record(version_dir)):
      return version_dir
  return None


def served_line(export_dir, version_dir):
  """Says which version TF Serving serves (models.config: the newest), given the one found."""
  newest = numeric_versions(export_dir)[-1]
  name = os.path.basename(version_dir)
  if name == newest:
    return f"version {name}, the newest, which TF Serving serves"
  return (f"version {name}; TF Serving serves the newest, version {newest}, "
          "unless its model_version_policy names another")
