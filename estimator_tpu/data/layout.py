"""A dataset directory's layout: split and shard names, labels.txt, manifest.json, rejected.csv.

The one place that names the files preprocess.py writes and train.py,
export and serving read, and the one text format of a labels file (also
used for an export's assets.extra/labels.txt). Imports no TensorFlow.
"""

import collections

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
TRAIN_GLOB = f"{TRAIN}-*"
EVAL_GLOB = f"{VALIDATION}-*"
LABELS_FILE = "labels.txt"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
REJECTED_FILE = "rejected.csv"
REJECTED_HEADER = ("path", "reason")
# A run writes here first (its inputs, the command that started it) and removes the folder after
# manifest.json: the folder without a manifest is a stopped run's output, not a dataset.
TEMP_DIR_PREFIX = ".preprocess-temp-"
COMMAND_FILE = "command.txt"


def shard_name(split, index, num_shards):
  """`train-00003-of-00016.tfrecord`: the shard file name every writer and reader uses."""
  return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


def shard_glob(split):
  """The pattern of one split's shards that preprocess.py writes."""
  return f"{split}-*-of-*.tfrecord"


def format_labels(class_names):
  """labels.txt's text: one class name a line, in label order."""
  return "".join(f"{name}\n" for name in class_names)


def parse_labels(text, source):
  """The class names of a labels file's text (blank lines skipped, a BOM allowed).

  Args:
    text: the file's contents.
    source: how an error names the file, e.g. '--labels_file=x.txt'.

  Raises:
    ValueError: no class name, or one listed twice.
  """
  names = [line.strip() for line in text.lstrip("\ufeff").splitlines()]
  names = [name for name in names if name]
  if not names:
    raise ValueError(f"{source} holds no class names")
  duplicates = sorted(name for name, n in collections.Counter(names).items() if n > 1)
  if duplicates:
    raise ValueError(f"{source} lists {duplicates[0]!r} more than once")
  return tuple(names)
