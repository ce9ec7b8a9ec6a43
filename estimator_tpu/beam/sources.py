"""What preprocess.py reads and where each file goes, decided before Beam runs.

Lists a class-folder tree or reads a `path,label` CSV, fixes the label order,
assigns every file a split and shard deterministically, and checks the output
directory. Problems with the flags raise InputError with a message naming the
flag and its value.

Longer than most modules (about 360 lines) because its one idea has many
inputs: class folders, CSV rows, labels files, output-dir checks, and the
hash split that must stay stable as the data grows.
"""

import csv
import hashlib
import io
import math
import os
import re
import typing
import warnings

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from estimator_tpu.beam import plan as plan_lib
from estimator_tpu.data import layout

TARGET_SHARD_BYTES = 100 * 10**6
_SIZE_SAMPLE = 64
_CSV_HEADER = ("path", "label")


class InputError(ValueError):
  """A problem with a flag or the input it names; nothing has been written."""


class Candidate(typing.NamedTuple):
  """An input file before planning; size is None when not listed."""
  path: str
  class_name: str
  size: typing.Optional[int] = None


def _is_local(path):
  return FileSystems.get_scheme(path) is None


def _normalize(path):
  return os.path.abspath(path) if _is_local(path) else path.rstrip("/")


def _escape_glob(path):
  return re.sub(r"([*?\[])", r"[\1]", path)


def _match(pattern, limit=None):
  """FileMetadata of files matching a Beam glob (`**` crosses folders)."""
  with warnings.catch_warnings():
    # "[[]" (a literal "[") becomes the regex "[[]", which re flags as
    # possibly nested; it is not.
    warnings.simplefilter("ignore", FutureWarning)
    return FileSystems.match([pattern], [limit])[0].metadata_list


def _read_text(path):
  with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) \
      as f:
    return f.read().decode("utf-8-sig")


def read_labels_file(labels_file):
  """Class names, one per line, in label order (blank lines skipped)."""
  if not FileSystems.exists(labels_file):
    raise InputError(f"--labels_file={labels_file} does not exist")
  try:
    return list(layout.parse_labels(_read_text(labels_file), f"--labels_file={labels_file}"))
  except ValueError as e:
    raise InputError(str(e)) from e


def _hidden(relative):
  return any(part.startswith(".") for part in relative.split("/"))


def list_folder(input_dir):
  """Lists input_dir/<class>/**; hidden files and folders are skipped.

  Returns:
    (candidates, rejected rows) where files not inside a class folder are
    rejected.

  Raises:
    InputError: input_dir is missing or holds no files.
  """
  root = _normalize(input_dir)
  if _is_local(root) and not os.path.isdir(root):
    raise InputError(f"--input_dir={input_dir} does not exist or is not a "
                     "directory")
  metadata = _match(_escape_glob(root) + "/**")
  shown = input_dir.rstrip("/") or input_dir  # input_dir/ would read input_dir//<class>/
  candidates, rejected = [], []
  for meta in sorted(metadata, key=lambda m: m.path):
    relative = meta.path[len(root) + 1:].replace(os.sep, "/")
    if _hidden(relative):
      continue
    if "/" not in relative:
      rejected.append((meta.path, f"{plan_lib.NOT_IN_CLASS_FOLDER}: files "
                       f"must be in {shown}/<class>/"))
      continue
    candidates.append(Candidate(meta.path, relative.split("/", 1)[0],
                                meta.size_in_bytes))
  if not candidates:
    raise InputError(f"--input_dir={input_dir} holds no files in class "
                     f"sub-folders (expected {shown}/<class>/<image>)")
  return candidates, rejected


def _resolve(path, base_dir):
  if FileSystems.get_scheme(path) is not None or os.path.isabs(path):
    return path
  return _normalize(FileSystems.join(base_dir, path))


def _csv_row(row, line, input_csv, base_dir, seen):
  """A Candidate or a rejected (path, reason) row for one CSV row."""
  where = f"{input_csv}:{line}"
  if len(row) != 2 or not row[0].strip() or not row[1].strip():
    return None, (where, f"{plan_lib.MALFORMED_CSV_ROW}: expected "
                  f"'path,label', got {','.join(row)!r}")
  path = _resolve(row[0].strip(), base_dir)
  if path in seen:
    return None, (path, f"{plan_lib.DUPLICATE_PATH}: also on line "
                  f"{seen[path]} of {input_csv}")
  seen[path] = line
  return Candidate(path, row[1].strip()), None


def read_csv(input_csv):
  """Reads `path,label` rows (an optional `path,label` header is skipped).

  Relative paths are relative to the CSV's folder.

  Returns:
    (candidates, rejected rows).

  Raises:
    InputError: the CSV is missing or lists no images.
  """
  if not FileSystems.exists(input_csv):
    raise InputError(f"--input_csv={input_csv} does not exist")
  base_dir = os.path.dirname(_normalize(input_csv)) if _is_local(input_csv) \
      else input_csv.rsplit("/", 1)[0]
  candidates, rejected, seen = [], [], {}
  reader = csv.reader(io.StringIO(_read_text(input_csv)))
  for line, row in enumerate(reader, start=1):
    if not row or (line == 1 and tuple(c.strip().lower() for c in row)
                   == _CSV_HEADER):
      continue
    candidate, reject = _csv_row(row, line, input_csv, base_dir, seen)
    (rejected if reject else candidates).append(reject or candidate)
  if not candidates:
    raise InputError(f"--input_csv={input_csv} lists no images "
                     f"({len(rejected)} malformed or duplicate rows)")
  return candidates, rejected


def apply_labels(candidates, labels):
  """Splits candidates into known-label ones and unknown_label rejects."""
  known = set(labels)
  kept = [c for c in candidates if c.class_name in known]
  rejected = [(c.path, f"{plan_lib.UNKNOWN_LABEL}: {c.class_name!r} is not in "
               "the labels file") for c in candidates
              if c.class_name not in known]
  return kept, rejected


def split_digest(class_name, path):
  """16 bytes from sha256 of '<class>/<file name>': stable everywhere.

  The folder is left out so the split does not change when the data moves
  (local disk vs gs://, --input_dir vs --input_csv).
  """
  key = f"{class_name}/{path.rstrip('/').rsplit('/', 1)[-1]}"
  return hashlib.sha256(key.encode("utf-8")).digest()[:16]


def split_point(digest):
  """Where a file falls in [0, 1): it goes to validation below the fraction."""
  return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(candidates, validation_fraction):
  """{candidate: split}: by hash, per class, so stable as the data grows.

  A file goes to validation when split_point(split_digest(...)) is below
  validation_fraction, so adding or removing files does not move others.
  Within a class of two or more files, the file with the lowest point goes
  to validation and the one with the highest to train if the hash alone left
  a split without that class (when validation_fraction > 0).
  """
  by_class = {}
  for candidate in candidates:
    by_class.setdefault(candidate.class_name, []).append(candidate)
  splits = {}
  for members in by_class.values():
    members.sort(key=lambda c: (split_digest(c.class_name, c.path), c.path))
    cut = sum(split_point(split_digest(c.class_name, c.path))
              < validation_fraction for c in members)
    if validation_fraction > 0 and len(members) >= 2:
      cut = min(max(cut, 1), len(members) - 1)
    for index, candidate in enumerate(members):
      splits[candidate] = layout.VALIDATION if index < cut else layout.TRAIN
  return splits


def _known_sizes(candidates):
  """Sizes of candidates (a deterministic sample is matched when unknown)."""
  sizes = [c.size for c in candidates if c.size is not None]
  if sizes or not candidates:
    return sizes
  sample = sorted(candidates, key=lambda c: split_digest(c.class_name, c.path))
  for candidate in sample[:_SIZE_SAMPLE]:
    found = _match(_escape_glob(candidate.path))
    sizes.extend(m.size_in_bytes for m in found[:1])
  return sizes


def choose_num_shards(candidates, num_shards=None):
  """Shards for one split: num_shards, or ~TARGET_SHARD_BYTES each (>= 1)."""
  if not candidates:
    return 0
  if num_shards:
    return num_shards
  sizes = _known_sizes(candidates)
  mean = sum(sizes) / len(sizes) if sizes else 0
  return max(1, math.ceil(mean * len(candidates) / TARGET_SHARD_BYTES))


def make_items(candidates, labels, validation_fraction, num_shards=None):
  """InputItems with label, split and shard; also returns {split: shards}."""
  splits = assign_splits(candidates, validation_fraction)
  shards = {split: choose_num_shards(
      [c for c in candidates if splits[c] == split], num_shards)
            for split in layout.SPLITS}
  index = {name: i for i, name in enumerate(labels)}
  items = []
  for c in sorted(candidates):
    split = splits[c]
    digest = split_digest(c.class_name, c.path)
    shard = int.from_bytes(digest[8:16], "big") % shards[split]
    items.append(plan_lib.InputItem(c.path, index[c.class_name],
                                    c.class_name, split, shard))
  return tuple(items), shards


def _check_values(validation_fraction, num_shards, max_size):
  if not 0 <= validation_fraction < 1:
    raise InputError(f"--validation_fraction={validation_fraction} must be "
                     ">= 0 and < 1")
  if num_shards is not None and num_shards < 1:
    raise InputError(f"--num_shards={num_shards} must be at least 1")
  if max_size is not None and max_size < 1:
    raise InputError(f"--max_size={max_size} must be at least 1 pixel")


def _candidates(input_dir, input_csv, labels_file):
  """(labels, candidates, rejected rows) from whichever input was given."""
  if bool(input_dir) == bool(input_csv):
    raise InputError("give exactly one of --input_dir or --input_csv (got "
                     f"{'both' if input_dir else 'neither'})")
  if input_dir:
    candidates, rejected = list_folder(input_dir)
  else:
    candidates, rejected = read_csv(input_csv)
  if labels_file:
    labels = read_labels_file(labels_file)
  else:
    labels = sorted({c.class_name for c in candidates})
  candidates, unknown = apply_labels(candidates, labels)
  if not candidates:
    raise InputError(f"no input has a class in --labels_file={labels_file}")
  return labels, candidates, rejected + unknown


def make_plan(output_dir, input_dir=None, input_csv=None, labels_file=None,
              validation_fraction=0.1, num_shards=None, max_size=None,
              settings=None):
  """Resolves the flags into a beam_pipeline.Plan (reads no image).

  Raises:
    InputError: a flag value is invalid or the input holds no files.
  """
  if not output_dir:
    raise InputError("--output_dir is required")
  _check_values(validation_fraction, num_shards, max_size)
  labels, candidates, rejected = _candidates(input_dir, input_csv, labels_file)
  items, shards = make_items(candidates, labels, validation_fraction,
                             num_shards)
  return plan_lib.Plan(
      labels=tuple(labels), items=items, rejected=tuple(rejected),
      output_dir=_normalize(output_dir), num_shards=shards, max_size=max_size,
      settings=dict(settings or {}))


def _matching(output_dir, pattern):
  return sorted(m.path for m in _match(
      FileSystems.join(_escape_glob(output_dir), pattern)))


def _dataset_files(output_dir):
  """Paths a previous run wrote into output_dir, manifest.json first."""
  found = [FileSystems.join(output_dir, name) for name in
           (layout.MANIFEST_FILE, layout.LABELS_FILE,
            layout.REJECTED_FILE)]
  found = [path for path in found if FileSystems.exists(path)]
  for split in layout.SPLITS:
    found += _matching(output_dir, layout.shard_glob(split))
  # Part files a crashed run left behind, removed folder by folder.
  temp_dirs = {path[:len(output_dir) + 1] + path[len(output_dir) + 1:]
               .split("/")[0] for path in
               _matching(output_dir, f"{layout.TEMP_DIR_PREFIX}*/**")}
  return found + sorted(temp_dirs)


def check_output_dir(output_dir, overwrite, input_dir=None, report=None):
  """Fails if output_dir is unusable or already holds a dataset.

  With overwrite, the old dataset is deleted instead, manifest.json first so
  the directory never looks complete while it is being replaced. What a
  stopped run left (its temporary folder, and no manifest.json) is no dataset:
  it is removed, and report (if given) says so in one line.

  Returns:
    Whether output_dir exists already (always True for gs:// and the like).

  Raises:
    InputError: output_dir is a file, inside input_dir, or holds a dataset
      and overwrite is False.
  """
  output_dir = _normalize(output_dir)
  if _is_local(output_dir) and os.path.exists(output_dir) and not \
      os.path.isdir(output_dir):
    raise InputError(f"--output_dir={output_dir} is a file, not a directory")
  if input_dir and _is_local(output_dir) and (
      output_dir + os.sep).startswith(_normalize(input_dir) + os.sep):
    raise InputError(f"--output_dir={output_dir} is inside "
                     f"--input_dir={input_dir}; choose a folder outside it")
  existing = _dataset_files(output_dir)
  if existing and not overwrite and not _unfinished(output_dir, existing):
    raise InputError(f"--output_dir={output_dir} already holds a dataset "
                     f"({existing[0].rsplit('/', 1)[-1]}); pass --overwrite "
                     "to replace it")
  if existing and not overwrite and report:
    report(f"--output_dir={output_dir} holds what a stopped run left (no "
           f"{layout.MANIFEST_FILE}): removed {len(existing)} file(s) and folder(s); "
           "starting again")
  remove_files(existing)
  return not _is_local(output_dir) or os.path.isdir(output_dir)


def _unfinished(output_dir, existing):
  """Whether existing (_dataset_files) is a stopped run's: its temporary folder, no manifest.

  A run writes its temporary folder before any shard and removes it only after
  manifest.json: shards without either are a dataset made elsewhere.
  """
  manifest = FileSystems.join(output_dir, layout.MANIFEST_FILE)
  temp = FileSystems.join(output_dir, layout.TEMP_DIR_PREFIX)
  return manifest not in existing and any(path.startswith(temp) for path in existing)


def remove_files(paths):
  """Deletes paths one by one, in order."""
  for path in paths:
    FileSystems.delete([path])


def remove_dataset(output_dir, remove_dir=False):
  """Deletes what preprocess.py wrote in output_dir, manifest.json first.

  With remove_dir, a local output_dir left empty is removed too.
  """
  output_dir = _normalize(output_dir)
  remove_files(_dataset_files(output_dir))
  if remove_dir and _is_local(output_dir) and not os.listdir(output_dir):
    os.rmdir(output_dir)
