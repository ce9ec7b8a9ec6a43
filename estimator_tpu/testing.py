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


def image_example(jpeg, label, class_names, name):
  """A tf.train.Example of preprocess.py's schema for encoded JPEG bytes."""
  height, width = tf.io.extract_jpeg_shape(jpeg).numpy()[:2]
  return schema.make_example(jpeg, int(label), class_names[label], int(height), int(width),
                             name)


def write_dataset(out_dir, splits, class_names, write_manifest=True):
  """Writes encoded images in preprocess.py's layout (shards, labels.txt, manifest.json).

  Args:
    out_dir: directory to write into (created).
    splits: {split name: ([(jpeg bytes, label)], number of shards)}.
    class_names: names in label order.
    write_manifest: also write manifest.json (False mimics tensorflow/tpu's
      jpeg_to_tf_record.py output, which has none).

  Returns:
    out_dir.
  """
  os.makedirs(out_dir, exist_ok=True)
  manifest = {"splits": {}, "labels": list(class_names)}
  for split, (images, num_shards) in splits.items():
    shard_files = []
    for shard in range(num_shards):
      name = layout.shard_name(split, shard, num_shards)
      write_records(os.path.join(out_dir, name), (
          image_example(jpeg, label, class_names, f"{split}{shard}/{i:04d}.jpg")
          for i, (jpeg, label) in enumerate(images[shard::num_shards])))
      shard_files.append(name)
    manifest["splits"][split] = {"count": len(images), "shards": shard_files}
  with open(os.path.join(out_dir, layout.LABELS_FILE), "w") as f:
    f.write(layout.format_labels(class_names))
  if write_manifest:
    with open(os.path.join(out_dir, layout.MANIFEST_FILE), "w") as f:
      json.dump(manifest, f, indent=2)
  return out_dir


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
  images, labels = datasets.digit_arrays(limit=num_train + num_eval, size=size)
  encoded = [(datasets.encode_jpeg(image), int(label)) for image, label in zip(images, labels)]
  return write_dataset(out_dir, {"train": (encoded[:num_train], train_shards),
                                 "validation": (encoded[num_train:], 1)},
                       datasets.digit_class_names(), write_manifest)
