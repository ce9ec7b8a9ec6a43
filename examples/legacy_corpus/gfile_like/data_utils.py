"""A 2019 language-model data script: TF 1's module paths for files, records and flags.

  python data_utils.py --data_dir=TEXT_DIR --save_dir=OUT --seq_len=8

Reads every *.txt file under --data_dir (tensorflow.gfile's Glob / Open), builds
a vocabulary ordered by frequency (ties by word), writes it to vocab.txt, and
writes each split's token ids as fixed-length TFRecord examples with
tf.python_io; it then counts the records back and writes corpus-info.json, as
Transformer-XL's data_utils.py did.
"""

import collections
import json
import os

from absl import flags

from estimator_tpu.compat import tf
from tensorflow.gfile import Exists
from tensorflow.gfile import Glob
from tensorflow.gfile import MakeDirs
from tensorflow.gfile import Open

flags.DEFINE_string("data_dir", None, "Directory of train*.txt / valid*.txt files.")
flags.DEFINE_string("save_dir", None, "Where vocab.txt, the records and corpus-info.json go.")
flags.DEFINE_integer("seq_len", 8, "Tokens per example.")
FLAGS = flags.FLAGS


def read_words(path):
  with Open(path, "r") as f:
    return [word for line in f for word in line.split() + ["<eos>"]]


def build_vocab(paths):
  counter = collections.Counter()
  for path in paths:
    counter.update(read_words(path))
  return [word for word, _ in sorted(counter.items(), key=lambda item: (-item[1], item[0]))]


def write_split(split, paths, word_to_id):
  """Writes `split`'s token ids in seq_len chunks; returns (record path, examples written)."""
  ids = [word_to_id[word] for path in paths for word in read_words(path)]
  record_path = os.path.join(FLAGS.save_dir, "%s.seq_len-%d.tfrecords" % (split, FLAGS.seq_len))
  count = 0
  with tf.python_io.TFRecordWriter(record_path) as writer:
    for start in range(0, len(ids) - FLAGS.seq_len, FLAGS.seq_len):
      chunk = ids[start:start + FLAGS.seq_len + 1]
      feature = {"inputs": tf.train.Feature(int64_list=tf.train.Int64List(value=chunk[:-1])),
                 "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=chunk[1:]))}
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature))
                   .SerializeToString())
      count += 1
  return record_path, count


def main(unused_argv):
  del unused_argv
  if not Exists(FLAGS.save_dir):
    MakeDirs(FLAGS.save_dir)
  splits = {split: sorted(Glob(os.path.join(FLAGS.data_dir, split + "*.txt")))
            for split in ("train", "valid")}
  vocab = build_vocab(splits["train"] + splits["valid"])
  with Open(os.path.join(FLAGS.save_dir, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  word_to_id = {word: i for i, word in enumerate(vocab)}
  info = {"vocab_size": len(vocab), "seq_len": FLAGS.seq_len, "num_examples": {}}
  for split, paths in sorted(splits.items()):
    record_path, written = write_split(split, paths, word_to_id)
    counted = sum(1 for _ in tf.python_io.tf_record_iterator(record_path))
    assert counted == written, (record_path, counted, written)
    info["num_examples"][split] = counted
  with Open(os.path.join(FLAGS.save_dir, "corpus-info.json"), "w") as f:
    json.dump(info, f, sort_keys=True)
  tf.logging.info("Wrote %s", info)


if __name__ == "__main__":
  tf.app.run(main)
