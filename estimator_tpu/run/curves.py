"""Learning curves: training scalars from event files, evaluations from eval_history.jsonl."""

import io
import json
import os

import numpy as np
import tensorflow as tf

from estimator_tpu import storage

HISTORY_FILE = "eval_history.jsonl"
CURVES_FILE = "learning_curves.png"
TRAIN_LOSS_TAG = "train/loss"
TRAIN_ACCURACY_TAG = "train/accuracy"
# An evaluation's loss: eval_loss, else the Estimator's `loss` (what a model_fn
# without an eval_loss metric reports; files written before eval_loss stood
# alone hold both).
EVAL_LOSS_KEYS = ("eval_loss", "loss")


def read_scalars(log_dir, tags):
  """{tag: [(step, value), ...]} sorted by step, from the event files directly in log_dir."""
  found = {tag: {} for tag in tags}
  for path in tf.io.gfile.glob(os.path.join(log_dir, "events.out.tfevents.*")):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          if value.tag in found:
            number = (value.simple_value if value.HasField("simple_value")
                      else float(tf.make_ndarray(value.tensor)))
            found[value.tag][int(event.step)] = number
    except tf.errors.DataLossError:
      continue  # a file still being written ends mid-record
  return {tag: sorted(points.items()) for tag, points in found.items()}


def read_history(model_dir):
  """The evaluation records appended by the loop, oldest first."""
  path = os.path.join(model_dir, HISTORY_FILE)
  if not storage.exists(path):
    return []
  return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


def append_history(model_dir, record):
  """Appends one evaluation record (a JSON-serializable dict) to eval_history.jsonl."""
  path = os.path.join(model_dir, HISTORY_FILE)
  lines = storage.read_text(path) if storage.exists(path) else ""
  # GFile has no append mode on every filesystem (gs://): the file is rewritten,
  # whole or not at all, so a full disk never leaves half a record.
  storage.write_atomically(path, lines + json.dumps(record, sort_keys=True) + "\n")


def set_aside_history_after(model_dir, step, aside_dir):
  """Moves the evaluation records of steps after `step` to aside_dir; returns how many.

  A run that resumes from an older checkpoint (a newer one was damaged) gives
  up the steps after it; their evaluations are appended to
  aside_dir/eval_history.jsonl rather than deleted.
  """
  history = read_history(model_dir)
  later = [record for record in history if record.get("step", 0) > step]
  if not later:
    return 0
  aside = os.path.join(aside_dir, HISTORY_FILE)
  tf.io.gfile.makedirs(aside_dir)
  previous = storage.read_text(aside) if storage.exists(aside) else ""
  storage.write_atomically(aside, previous + "".join(
      json.dumps(record, sort_keys=True) + "\n" for record in later))
  storage.write_atomically(os.path.join(model_dir, HISTORY_FILE), "".join(
      json.dumps(record, sort_keys=True) + "\n" for record in history
      if record.get("step", 0) <= step))
  return len(later)


def eval_points(history, keys):
  """[(step, value)] of the evaluation records: each record's first key of keys it has."""
  points = []
  for record in history:
    key = next((k for k in keys if k in record), None)
    if key is not None:
      points.append((record["step"], record[key]))
  return points


def _plot(axis, points, label, style="-"):
  if points:
    steps, values = zip(*points)
    axis.plot(steps, values, style, label=label)


def _smooth(points, window=20):
  if len(points) < 2 * window:
    return points
  steps, values = zip(*points)
  kernel = np.ones(window) / window
  smoothed = np.convolve(values, kernel, mode="valid")
  return list(zip(steps[window - 1:], smoothed))


def write_learning_curves(model_dir):
  """Writes model_dir/learning_curves.png (loss and accuracy per step); returns its path."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  scalars = read_scalars(model_dir, [TRAIN_LOSS_TAG, TRAIN_ACCURACY_TAG])
  history = read_history(model_dir)
  figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
  _plot(loss_axis, _smooth(scalars[TRAIN_LOSS_TAG]), "train")
  _plot(loss_axis, eval_points(history, EVAL_LOSS_KEYS), "eval", "o-")
  _plot(accuracy_axis, _smooth(scalars[TRAIN_ACCURACY_TAG]), "train (batch)")
  _plot(accuracy_axis, eval_points(history, ("accuracy",)), "eval", "o-")
  for axis, name in ((loss_axis, "loss"), (accuracy_axis, "accuracy")):
    axis.set_xlabel("step")
    axis.set_ylabel(name)
    axis.grid(alpha=0.3)
    if axis.get_lines():
      axis.legend()
  figure.tight_layout()
  path = os.path.join(model_dir, CURVES_FILE)
  png = io.BytesIO()
  figure.savefig(png, format="png", dpi=90)
  plt.close(figure)
  storage.write_atomically(path, png.getvalue())
  return path
