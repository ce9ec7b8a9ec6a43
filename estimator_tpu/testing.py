"""Writers of small real-JPEG TFRecord data sets for tests and benchmarks.

They write the same layout preprocess.py writes (train-*/validation-* shards,
labels.txt, manifest.json) without running Beam, so tests of training,
export and serving stay fast.
"""

import json
import os

import tensorflow as tf

from estimator_tpu.data import digits as datasets
from estimator_tpu.data import layout
from estimator_tpu.data import schema


def write_records(path, examples):
  """Writes tf.train.Examples to one TFRecord file; returns how many."""
  count = 0
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example.SerializeToString())
      count += 1
  return count


def _digit_examples(images, labels, names, prefix):
  for i, (image, label) in enumerate(zip(images, labels)):
    yield schema.make_example(
        datasets.encode_jpeg(image), int(label), names[label],
        image.shape[0], image.shape[1], f"{prefix}/{i:04d}.jpg")


def write_digits_dataset(out_dir, num_train=200, num_eval=37, size=32,
                         train_shards=2, write_manifest=True):
  """Writes a small digits data set in preprocess.py's layout.

  Args:
    out_dir: directory to write into (created).
    num_train: training images (the first ones of the digits).
    num_eval: validation images (the ones after the training images).
    size: image side in pixels.
    train_shards: number of training shards.
    write_manifest: also write manifest.json (False mimics tensorflow/tpu's
      jpeg_to_tf_record.py output, which has none).

  Returns:
    out_dir.
  """
  os.makedirs(out_dir, exist_ok=True)
  images, labels = datasets.digit_arrays(limit=num_train + num_eval, size=size)
  names = datasets.digit_class_names()
  splits = {
      "train": (images[:num_train], labels[:num_train], train_shards),
      "validation": (images[num_train:], labels[num_train:], 1),
  }
  manifest = {"splits": {}, "labels": names}
  for split, (split_images, split_labels, num_shards) in splits.items():
    shard_files = []
    for shard in range(num_shards):
      name = layout.shard_name(split, shard, num_shards)
      write_records(os.path.join(out_dir, name), _digit_examples(
          split_images[shard::num_shards], split_labels[shard::num_shards],
          names, f"{split}{shard}"))
      shard_files.append(name)
    manifest["splits"][split] = {"count": int(len(split_images)),
                                 "shards": shard_files}
  with open(os.path.join(out_dir, layout.LABELS_FILE), "w") as f:
    f.write(layout.format_labels(names))
  if write_manifest:
    with open(os.path.join(out_dir, layout.MANIFEST_FILE), "w") as f:
      json.dump(manifest, f, indent=2)
  return out_dir
