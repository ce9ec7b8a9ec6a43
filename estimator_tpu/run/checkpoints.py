"""Checkpoints that restore: the newest good one, damaged ones set aside, unfinished saves gone.

A checkpoint is `PREFIX.index` + `PREFIX.data-*` (+ `PREFIX.meta`), listed
in model_dir/checkpoint. A full disk or an interrupted copy can truncate
them; TF then fails on restore with a raw traceback (`IndexError: Read less
bytes than requested`). Here each candidate is read back in full first, so
a run resumes from the newest checkpoint that really restores.
"""

import os
import re

import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import storage

DAMAGED_DIR = "damaged"
GLOBAL_STEP = "global_step"
_STEP = re.compile(r"-(\d+)$")
# What TF leaves when a write stops half-way: atomic_write's `NAME.tmp<hex>`
# files and the Saver's `PREFIX_temp*` folders; storage.write_atomically's
# `NAME.tmp-<hex>` files.
_TEMP = re.compile(r"(\.tmp-?[0-9a-f]{32}$)|(_temp(_[0-9a-f]{32})?(/|$))")


def step_of(prefix):
  """model_dir/model.ckpt-1200 -> 1200 (-1 when the name carries no step)."""
  match = _STEP.search(prefix)
  return int(match.group(1)) if match else -1


def listed(model_dir):
  """The checkpoint prefixes model_dir/checkpoint lists, oldest first ([] when none)."""
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except (tf.errors.OpError, ValueError):
    state = None  # an unreadable state file: candidates() still finds the files
  if state is None:
    return []
  paths = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  return paths  # TF has joined relative entries to model_dir already


def newest(model_dir):
  """The prefix of the newest checkpoint the state file names, or None."""
  return tf.train.latest_checkpoint(model_dir)


def candidates(model_dir):
  """Every checkpoint prefix in model_dir, newest step first.

  Those the state file lists, and any whose index file is there although the
  state file is missing or unreadable.
  """
  found = set(listed(model_dir))
  if not found:
    found = {name[:-len(".index")] for name in
             tf.io.gfile.glob(os.path.join(model_dir, "*.index"))}
  return sorted(found, key=step_of, reverse=True)


def problem(prefix, expected_names=()):
  """Why the checkpoint at prefix would not restore, or None when it reads back whole.

  Reads the index and every tensor (TF checks each one's CRC as it reads).

  Args:
    prefix: the checkpoint prefix (model_dir/model.ckpt-N).
    expected_names: variable names it must hold (an older checkpoint's).

  Returns:
    A short reason (str), or None.
  """
  try:
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
  except Exception as e:  # DataLossError, NotFoundError, ... by the file's state
    return f"its index does not read ({storage.first_line(e)})"
  if GLOBAL_STEP not in shapes:
    return f"it holds no {GLOBAL_STEP}"
  missing = sorted(set(expected_names) - set(shapes))
  if missing:
    return f"it lacks {len(missing)} variable(s) older checkpoints have, e.g. {missing[0]}"
  for name in sorted(shapes):
    try:
      reader.get_tensor(name)
    except Exception as e:  # IndexError on a truncated data file, DataLossError on a bad CRC
      return f"variable {name} does not read ({type(e).__name__}: {storage.first_line(e)})"
  return None


def _names(prefix):
  try:
    return set(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
  except Exception:  # an unreadable index simply offers no names
    return set()


def checkpoint_bytes(prefix):
  """The bytes of a checkpoint's files (index, data shards, meta graph)."""
  return sum(tf.io.gfile.stat(path).length for path in tf.io.gfile.glob(prefix + ".*")
             if not _TEMP.search(path))


class MeasureHook(tf.compat.v1.train.SessionRunHook):
  """Records what one checkpoint of the graph takes on disk (`bytes`), before the first save."""

  def __init__(self):
    self.bytes = 0

  def begin(self):
    graph = tf.compat.v1.get_default_graph()
    variables = sum(v.dtype.base_dtype.size * v.shape.num_elements()
                    for v in tf.compat.v1.global_variables() if v.shape.is_fully_defined())
    # The data file holds the variables; the meta graph and graph.pbtxt the graph.
    self.bytes = variables + 2 * graph.as_graph_def().ByteSize()


def set_aside(prefix):
  """Moves a checkpoint's files into model_dir/damaged/ (never deletes); returns that folder."""
  model_dir, name = os.path.split(prefix)
  target = os.path.join(model_dir, DAMAGED_DIR)
  tf.io.gfile.makedirs(target)
  for path in tf.io.gfile.glob(prefix + ".*"):
    base = os.path.basename(path)
    destination, n = os.path.join(target, base), 1
    while tf.io.gfile.exists(destination):
      n += 1
      destination = os.path.join(target, f"{base}.{n}")
    tf.io.gfile.rename(path, destination)
  return target


def _point_state_at(model_dir, good, remaining):
  tf.compat.v1.train.update_checkpoint_state(
      model_dir, good, all_model_checkpoint_paths=sorted(remaining, key=step_of))


def newest_restorable(model_dir, fix=True, report=print):
  """The newest checkpoint in model_dir that restores, or None when there is none at all.

  Args:
    model_dir: the run's directory.
    fix: move each damaged newer checkpoint into model_dir/damaged/ and point
      model_dir/checkpoint at the good one, so TF resumes from it. Without
      fix (evaluation, export) damaged ones are only skipped.
    report: called with one line per damaged checkpoint.

  Returns:
    The checkpoint prefix, or None when model_dir has no checkpoint.

  Raises:
    ConfigError: there are checkpoints but none restores.
  """
  found = candidates(model_dir)
  damaged = []
  for i, prefix in enumerate(found):
    older = found[i + 1] if i + 1 < len(found) else None
    reason = problem(prefix, _names(older) if older else ())
    if reason is None:
      for bad, why in damaged:
        if fix:
          report(f"checkpoint {bad} is damaged: {why}; moved its files to {set_aside(bad)}/")
        else:
          report(f"skipping damaged checkpoint {bad}: {why}")
      if damaged and fix:
        _point_state_at(model_dir, prefix, [p for p in found if p not in dict(damaged)])
      return prefix
    damaged.append((prefix, reason))
  for bad, why in damaged:
    report(f"checkpoint {bad} is damaged: {why}")
  if damaged:
    raise config_lib.ConfigError(
        f"no checkpoint in --model_dir={model_dir} restores ({len(damaged)} damaged, "
        "left in place); to start again from step 0 use a new --model_dir")
  return None


def restored_step(prefix):
  """The global step stored in a checkpoint (0 for None)."""
  return int(tf.train.load_variable(prefix, GLOBAL_STEP)) if prefix else 0


def discard_unfinished(model_dir):
  """Removes what an interrupted save left in model_dir; returns the paths removed.

  TF's temporary files and folders (`*.tmp<hex>`, `*_temp*/`), and the files
  of any checkpoint newer than the newest one model_dir/checkpoint lists: TF
  lists a checkpoint only once its index and data are complete.
  """
  removed = []
  # With no state file (or an unreadable one) no checkpoint counts as unfinished.
  newest = max((step_of(p) for p in listed(model_dir)), default=float("inf"))
  for path in tf.io.gfile.listdir(model_dir) if tf.io.gfile.isdir(model_dir) else []:
    full = os.path.join(model_dir, path.rstrip("/"))
    stem = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", full)
    unfinished = (bool(_TEMP.search(full)) or
                  (stem != full and step_of(stem) > newest and
                   os.path.basename(stem).startswith("model.ckpt-")))
    if unfinished:
      if tf.io.gfile.isdir(full):
        tf.io.gfile.rmtree(full)
      else:
        tf.io.gfile.remove(full)
      removed.append(full)
  return removed
