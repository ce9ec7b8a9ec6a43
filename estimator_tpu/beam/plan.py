"""What preprocess.py runs: the Plan (items, splits, shard counts) and the reasons inputs fail.

Shared by beam/sources.py (which builds the Plan) and beam/pipeline.py
(which runs it); the file names are data/layout.py's. Imports no TensorFlow,
so flag errors fail fast.
"""

import dataclasses
import typing

# Reason codes: the first word of each rejected.csv reason and the keys of
# manifest["rejected"]["by_reason"].
EMPTY_FILE = "empty_file"
NOT_AN_IMAGE = "not_an_image"
CORRUPT_IMAGE = "corrupt_image"
IMAGE_TOO_LARGE = "image_too_large"
FILE_NOT_FOUND = "file_not_found"
READ_ERROR = "read_error"
UNKNOWN_LABEL = "unknown_label"
MALFORMED_CSV_ROW = "malformed_csv_row"
DUPLICATE_PATH = "duplicate_path"
NOT_IN_CLASS_FOLDER = "not_in_class_folder"


def reason_code(reason):
  """The code that starts a rejected.csv reason."""
  return reason.split(":", 1)[0]


class RejectedInput(Exception):
  """An input that cannot be written; `reason` is one of the codes above."""

  def __init__(self, reason, detail=""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason


class InputItem(typing.NamedTuple):
  """One input file and where its record goes."""
  path: str
  label: int
  class_name: str
  split: str
  shard: int


@dataclasses.dataclass(frozen=True)
class Plan:
  """Everything the pipeline needs, resolved from the flags before it runs.

  Attributes:
    labels: class names in label order.
    items: the InputItems to read, each with its split and shard.
    rejected: (path, reason) rows rejected before reading (e.g. CSV rows).
    output_dir: where shards, labels.txt, rejected.csv and manifest.json go.
    num_shards: {split: number of shards}; 0 for a split with no inputs.
    max_size: if set, images whose long side is larger are downsized to it.
    settings: the flags used, recorded in the manifest.
    command: the command line that started the run, kept in its temporary
      folder until it ends (so that a stopped run's output says how to finish it).
  """
  labels: tuple
  items: tuple
  rejected: tuple
  output_dir: str
  num_shards: dict
  max_size: typing.Optional[int] = None
  settings: dict = dataclasses.field(default_factory=dict)
  command: str = ""
