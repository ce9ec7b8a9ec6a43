"""Batch prediction with an exported SavedModel and no server: images in, one CSV row per image out.

    python -m serving.predict --saved_model=EXPORT[/VERSION] --input=SOURCE \
        --output=preds.csv [--batch_size=64] [--all_probabilities] [--progress_secs=10]

SOURCE is one of
  a folder     images in it (unlabelled) and in class sub-folders (labelled by
               the folder's name)
  a CSV file   lines `path[,label]`; relative paths are relative to the CSV
  a glob       of image files (unlabelled), or of TFRecord files
  TFRecords    a file or glob in the project's schema (features.parse_example);
               id = image/filename, labelled by image/class/label

The output CSV has columns id,label,probability[,one per class],error. Each image
is read and decoded before its batch runs, so a bad file becomes a row with an
empty label and the reason in `error` instead of failing its batch. With labels
in the input, accuracy is printed at the end. Progress goes to stderr. Bad flags
print one line naming the value and exit with status 2.

About 350 lines for one idea, the offline predictor: four kinds of SOURCE,
batched prediction with per-image retry, and the CSV with its summary.
"""

import argparse
import collections
import concurrent.futures
import csv
import itertools
import os
import sys
import time

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from estimator_tpu import cli
from estimator_tpu import serving as serving_lib
from estimator_tpu.cli import parsing

# TensorFlow loads with these, after the flags are parsed (--help answers at once).
tf = cli.lazy_import("tensorflow")
image_ops = cli.lazy_import("estimator_tpu.data.image_ops")
features = cli.lazy_import("estimator_tpu.data.schema")
contract = cli.lazy_import("estimator_tpu.export.contract")
export_lib = cli.lazy_import("estimator_tpu.export.saved_model")

PROG = "python -m serving.predict"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
CSV_HEADER_NAMES = ("path", "id", "file", "filename")
ID, LABEL, PROBABILITY, ERROR = "id", "label", "probability", "error"
DEFAULT_BATCH_SIZE = 64
DEFAULT_PROGRESS_SECS = 10.0
LOAD_THREADS = 4

# label: the true label as text (None when unknown); label_index: the true
# classid when the input stores one (TFRecords); exactly one of path / image_bytes.
Item = collections.namedtuple("Item", ["id", "label", "label_index", "path", "image_bytes"])
# One image's answer: error is None, or the reason and the rest is None.
Result = collections.namedtuple("Result", ["label", "classid", "probabilities", "error"])


def plural(count, noun):
  return f"{count} {noun}" + ("" if count == 1 else "s")


class InputError(ValueError):
  """A flag names something unusable; the message names the flag and its value."""


def is_image_file(path):
  return os.path.splitext(path)[1].lower() in IMAGE_EXTENSIONS


def resolve_saved_model(path):
  """A SavedModel dir, or a base dir whose newest numeric version is taken."""
  if not tf.io.gfile.isdir(path):
    raise InputError(f"--saved_model={path} is not a directory")
  if tf.io.gfile.exists(os.path.join(path, contract.SAVED_MODEL_FILE)):
    return path
  latest = export_lib.latest_export(path)
  if latest is None:
    raise InputError(f"--saved_model={path} holds neither {contract.SAVED_MODEL_FILE} "
                     "nor numeric version directories: pass an export.py output")
  return latest


def folder_items(folder):
  """Images in folder (unlabelled) and in its sub-folders (labelled by sub-folder)."""
  items = []
  for name in sorted(tf.io.gfile.listdir(folder)):
    name = name.rstrip("/")
    path = os.path.join(folder, name)
    if tf.io.gfile.isdir(path):
      items.extend(Item(os.path.join(path, f), name, None, os.path.join(path, f), None)
                   for f in sorted(tf.io.gfile.listdir(path)) if is_image_file(f))
    elif is_image_file(name):
      items.append(Item(path, None, None, path, None))
  return items


def csv_items(csv_path):
  """Items of a `path[,label]` CSV (an optional header line is skipped)."""
  base = os.path.dirname(csv_path)
  items = []
  with tf.io.gfile.GFile(csv_path) as f:
    for number, row in enumerate(csv.reader(f), 1):
      row = [cell.strip() for cell in row]
      if not row or not row[0] or (number == 1 and row[0].lower() in CSV_HEADER_NAMES):
        continue
      path = row[0] if os.path.isabs(row[0]) or "://" in row[0] else os.path.join(base, row[0])
      label = row[1] if len(row) > 1 and row[1] else None
      items.append(Item(row[0], label, None, path, None))
  return items


def tfrecord_items(files):
  """Yields the Items of TFRecord files in the project's schema, in file order."""
  dataset = tf.data.TFRecordDataset(files).map(
      tf.autograph.experimental.do_not_convert(features.parse_example))  # no AutoGraph: time only
  for index, record in enumerate(dataset.as_numpy_iterator()):
    name = record["filename"].decode("utf-8", "replace") or f"record-{index}"
    text = record["class_name"].decode("utf-8", "replace") or None
    yield Item(name, text, int(record["label"]), None, record["image_bytes"])


def list_items(source):
  """--input -> (iterable of Item, count or None when streamed).

  Raises:
    InputError: nothing matches, or a glob mixes images and other files.
  """
  if tf.io.gfile.isdir(source):
    items = folder_items(source)
    if not items:
      raise InputError(f"--input={source} holds no images ({', '.join(IMAGE_EXTENSIONS)}) "
                       "in it or in its sub-folders")
    return items, len(items)
  if source.lower().endswith(".csv"):
    if not tf.io.gfile.exists(source):
      raise InputError(f"--input={source} does not exist")
    items = csv_items(source)
    if not items:
      raise InputError(f"--input={source} lists no images")
    return items, len(items)
  files = sorted(tf.io.gfile.glob(source))
  if not files:
    raise InputError(f"--input={source} matches no files")
  images = [f for f in files if is_image_file(f)]
  if not images:
    return tfrecord_items(files), None
  if len(images) != len(files):
    raise InputError(f"--input={source} matches images and other files; "
                     "use a pattern that matches images only or TFRecords only")
  return [Item(f, None, None, f, None) for f in images], len(images)


def load_image(item):
  """Reads and test-decodes one image with the decoder serving uses.

  Returns:
    (image_bytes, None), or (None, reason) when it cannot be read or decoded.
  """
  try:
    image_bytes = item.image_bytes
    if image_bytes is None:
      with tf.io.gfile.GFile(item.path, "rb") as f:
        image_bytes = f.read()
    image_ops.decode_image(tf.constant(image_bytes))
    return image_bytes, None
  except tf.errors.OpError as e:
    return None, serving_lib.error_reason(e)
  except OSError as e:
    return None, f"cannot read {item.path}: {e.strerror or e}"


def model_preprocessing(signatures):
  """contract.Preprocessing of a loaded SavedModel's signatures: what serving_default does.

  Asked of the `preprocessing` signature; an export without one resized the
  whole image to its predict_images input's size.
  """
  if contract.PREPROCESSING_SIGNATURE in signatures:
    outputs = signatures[contract.PREPROCESSING_SIGNATURE](
        **{contract.IMAGE_BYTES: tf.constant([b""])})
    return contract.preprocessing_of({key: value.numpy() for key, value in outputs.items()})
  images = signatures[contract.PREDICT_IMAGES_SIGNATURE].structured_input_signature[1]
  return contract.Preprocessing(int(images[contract.IMAGES].shape[1]), contract.WHOLE_IMAGE)


def describe_preprocessing(preprocessing):
  """One line: what the model does to an image before its network sees it."""
  size = preprocessing.image_size
  fraction = preprocessing.central_fraction
  if fraction >= contract.WHOLE_IMAGE:
    return f"the model resizes each whole image to {size}x{size} px"
  if preprocessing.crop_form == image_ops.SQUARE:
    return (f"the model keeps a central square of {fraction:g} of each image's shorter "
            f"side (--eval_crop), resized to {size}x{size} px")
  return (f"the model keeps the central {fraction:g} of each image side (--eval_crop, "
          f"--eval_crop_form=per_side), resized to {size}x{size} px")


class Predictor:
  """The SavedModel's serving_default signature, loaded once."""

  def __init__(self, saved_model_dir):
    # The signature only lives as long as the loaded object: keep both.
    self._loaded = tf.saved_model.load(saved_model_dir)
    self._signature = self._loaded.signatures[contract.SERVING_SIGNATURE]
    outputs = self._signature.structured_outputs
    self.num_classes = int(outputs[contract.PROBABILITIES].shape[-1])
    self.class_names = (contract.read_labels(saved_model_dir)
                        or [str(i) for i in range(self.num_classes)])
    self.preprocessing = model_preprocessing(self._loaded.signatures)

  def _run(self, image_bytes_list):
    outputs = self._signature(**{contract.IMAGE_BYTES: tf.constant(image_bytes_list)})
    outputs = {key: value.numpy() for key, value in outputs.items()}
    labels = outputs.get(contract.CLASS)
    results = []
    for i, (probabilities, classid) in enumerate(
        zip(outputs[contract.PROBABILITIES], outputs[contract.CLASSID])):
      label = labels[i].decode("utf-8", "replace") if labels is not None else (
          self.class_names[classid])
      results.append(Result(label, int(classid), probabilities, None))
    return results

  def predict(self, image_bytes_list):
    """[bytes] -> [Result]; if the batch fails, its images run one by one so only bad ones fail."""
    if not image_bytes_list:
      return []
    try:
      return self._run(image_bytes_list)
    except tf.errors.InvalidArgumentError as e:
      if len(image_bytes_list) == 1:
        return [Result(None, None, None, serving_lib.error_reason(e))]
      return [r for b in image_bytes_list for r in self.predict([b])]


def probability_columns(class_names):
  """One column name per class: the class name, prefixed where it would clash."""
  fixed = {ID, LABEL, PROBABILITY, ERROR}
  return [f"{PROBABILITY}_{name}" if name in fixed else name for name in class_names]


def csv_row(item, result, all_probabilities, num_classes):
  if result.error is not None:
    return [item.id, "", ""] + [""] * (num_classes if all_probabilities else 0) + [result.error]
  row = [item.id, result.label, f"{result.probabilities[result.classid]:.6f}"]
  if all_probabilities:
    row += [f"{p:.6f}" for p in result.probabilities]
  return row + [""]


def is_correct(item, result, class_names):
  """Whether a labelled item's prediction is right (by classid when the input has one)."""
  if item.label_index is not None:
    return result.classid == item.label_index
  if item.label in class_names:
    return item.label == result.label
  return item.label == str(result.classid)


class Stats:
  """Counts of images, error rows, labelled and correctly predicted images."""

  def __init__(self):
    self.images = self.errors = self.labelled = self.correct = 0

  def add(self, item, result, class_names):
    self.images += 1
    if result.error is not None:
      self.errors += 1
    elif item.label is not None or item.label_index is not None:
      self.labelled += 1
      self.correct += is_correct(item, result, class_names)


class Progress:
  """Prints `done/total images, errors, images/s` to stderr at most every `every_secs`."""

  def __init__(self, total, every_secs, stream=None):
    self.total, self.every_secs, self.stream = total, every_secs, stream
    self.start = self.last = time.monotonic()

  def update(self, stats, final=False):
    now = time.monotonic()
    if not final and now - self.last < self.every_secs:
      return
    self.last = now
    elapsed = max(now - self.start, 1e-9)
    done = f"{stats.images}/{self.total}" if self.total else f"{stats.images}"
    print(f"{PROG}: {done} images, {plural(stats.errors, 'error')}, "
          f"{stats.images / elapsed:.1f} images/s, {elapsed:.0f}s",
          file=self.stream or sys.stderr, flush=True)


def chunked(items, size):
  """Yields consecutive lists of at most size items from any iterable."""
  iterator = iter(items)
  while chunk := list(itertools.islice(iterator, size)):
    yield chunk


def loaded_batches(items, batch_size, pool):
  """Yields (items, [(bytes, reason)]) per batch; the next batch loads while one is used."""
  pending = None
  for chunk in chunked(items, batch_size):
    futures = [pool.submit(load_image, item) for item in chunk]
    if pending is not None:
      yield pending[0], [f.result() for f in pending[1]]
    pending = (chunk, futures)
  if pending is not None:
    yield pending[0], [f.result() for f in pending[1]]


def write_predictions(predictor, items, writer, batch_size, all_probabilities, progress):
  """Predicts items in batches and writes one CSV row each; returns the Stats."""
  columns = probability_columns(predictor.class_names) if all_probabilities else []
  writer.writerow([ID, LABEL, PROBABILITY] + columns + [ERROR])
  stats = Stats()
  with concurrent.futures.ThreadPoolExecutor(LOAD_THREADS) as pool:
    for chunk, loaded in loaded_batches(items, batch_size, pool):
      good = iter(predictor.predict([b for b, reason in loaded if reason is None]))
      for item, (_, reason) in zip(chunk, loaded):
        result = next(good) if reason is None else Result(None, None, None, reason)
        writer.writerow(csv_row(item, result, all_probabilities, predictor.num_classes))
        stats.add(item, result, predictor.class_names)
      progress.update(stats)
  progress.update(stats, final=True)
  return stats


def build_parser():
  """The command's argparse parser (its flags, for --help and the tests)."""
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
  parser.error = lambda message: _usage_error(parser, message)
  parser.add_argument("--saved_model", required=True,
                      help="an export version dir, or the export dir (newest version)")
  parser.add_argument("--input", required=True, help="folder, glob, CSV or TFRecord pattern")
  parser.add_argument("--output", required=True, help="CSV file to write")
  parser.add_argument("--batch_size", type=int, default=DEFAULT_BATCH_SIZE,
                      help=f"images per call of the model (default: {DEFAULT_BATCH_SIZE})")
  parser.add_argument("--all_probabilities", action="store_true",
                      help="add one probability column per class, named by class")
  parser.add_argument("--progress_secs", type=float, default=DEFAULT_PROGRESS_SECS,
                      help="seconds between progress lines on stderr "
                           f"(default: {DEFAULT_PROGRESS_SECS:g})")
  return parser


def parse_args(argv):
  parser = build_parser()
  parsing.check_argparse_flags(parser, sys.argv[1:] if argv is None else argv)
  return parser.parse_args(argv)


def _usage_error(parser, message):
  """argparse's error, in this project's one-line form; exit 2."""
  sys.exit(cli.fail(parser.prog, f"{message}; {parser.prog} --help lists the flags",
                    cli.EXIT_USAGE))


def check_args(args):
  """Resolves --saved_model and --input; raises InputError naming a bad flag."""
  if args.batch_size <= 0:
    raise InputError(f"--batch_size={args.batch_size} must be positive")
  output_dir = os.path.dirname(os.path.abspath(args.output))
  if not tf.io.gfile.isdir(output_dir):
    raise InputError(f"--output={args.output}: directory {output_dir} does not exist")
  saved_model = resolve_saved_model(args.saved_model)
  items, total = list_items(args.input)
  return saved_model, items, total


def main(argv=None):
  """Runs the predictor; returns the exit status (0 done, 1 unreadable input, 2 bad flags)."""
  global PROG
  PROG = cli.program_name("python -m serving.predict")
  args = parse_args(argv)
  try:
    saved_model, items, total = check_args(args)
  except InputError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  predictor = Predictor(saved_model)
  print(f"{PROG}: {saved_model}: {describe_preprocessing(predictor.preprocessing)}", flush=True)
  try:
    with open(args.output, "w", newline="") as f:
      stats = write_predictions(predictor, items, csv.writer(f), args.batch_size,
                                args.all_probabilities, Progress(total, args.progress_secs))
  except tf.errors.OpError as e:  # e.g. a corrupt TFRecord file: rows so far are written
    print(f"{PROG}: error: reading --input={args.input}: {serving_lib.error_reason(e)}",
          file=sys.stderr)
    return 1
  print(f"wrote {stats.images} rows to {args.output}: "
        f"{stats.images - stats.errors} predicted, {plural(stats.errors, 'error')}")
  if stats.labelled:
    print(f"accuracy {stats.correct / stats.labelled:.4f} "
          f"({stats.correct}/{stats.labelled} labelled images; errors not counted)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
