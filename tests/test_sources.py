"""Tests of preprocess_inputs: listing, CSV, labels, splits, shards, checks."""

import collections
import os

import conftest
import pytest

from estimator_tpu.beam import sources as pi
from estimator_tpu.data import layout


def _write(path, data=b"x"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb" if isinstance(data, bytes) else "w") as f:
    f.write(data)


def test_list_folder_skips_hidden_and_rejects_loose_files(image_folder):
  candidates, rejected = pi.list_folder(image_folder)
  classes = collections.Counter(c.class_name for c in candidates)
  assert classes == {"cat": 11, "dog": 10, "ñandú": 9}
  assert [os.path.basename(p) for p, _ in rejected] == ["README.txt"]
  assert rejected[0][1].startswith("not_in_class_folder")
  assert not [c for c in candidates if ".DS_Store" in c.path]
  assert all(c.size is not None for c in candidates)


def test_rejected_paths_and_reasons_have_no_double_slash_for_a_trailing_slash(tmp_path):
  _write(str(tmp_path / "photos" / "cat" / "a.jpg"))
  _write(str(tmp_path / "photos" / "loose.jpg"))
  candidates, rejected = pi.list_folder(str(tmp_path / "photos") + "/")
  assert [c.path for c in candidates] == [str(tmp_path / "photos" / "cat" / "a.jpg")]
  assert rejected == [(str(tmp_path / "photos" / "loose.jpg"),
                       f"not_in_class_folder: files must be in {tmp_path}/photos/<class>/")]


def test_list_folder_handles_glob_characters_in_names(tmp_path):
  _write(str(tmp_path / "photos [2020]" / "a*b" / "x?.jpg"))
  candidates, _ = pi.list_folder(str(tmp_path / "photos [2020]"))
  assert [(os.path.basename(c.path), c.class_name) for c in candidates] == [
      ("x?.jpg", "a*b")]


def test_read_csv_rows(tmp_path):
  _write(str(tmp_path / "f.csv"),
         'path,label\nimg/a.jpg,cat\n"/abs/with,comma.jpg", dog \n\n'
         "bad row\nimg/a.jpg,dog\n,cat\n")
  candidates, rejected = pi.read_csv(str(tmp_path / "f.csv"))
  assert candidates == [(str(tmp_path / "img" / "a.jpg"), "cat", None),
                        ("/abs/with,comma.jpg", "dog", None)]
  assert [r.split(":")[0] for _, r in rejected] == [
      "malformed_csv_row", "duplicate_path", "malformed_csv_row"]
  assert rejected[0][0] == f"{tmp_path / 'f.csv'}:5"


def test_labels_file_orders_labels_and_rejects_unknown(tmp_path):
  _write(str(tmp_path / "labels.txt"), "zebra\n\nant\n")
  assert pi.read_labels_file(str(tmp_path / "labels.txt")) == ["zebra", "ant"]
  kept, rejected = pi.apply_labels(
      [pi.Candidate("a.jpg", "ant"), pi.Candidate("b.jpg", "bee")],
      ["zebra", "ant"])
  assert kept == [("a.jpg", "ant", None)]
  assert rejected == [("b.jpg", "unknown_label: 'bee' is not in the labels "
                       "file")]


def test_split_digest_is_stable_and_ignores_the_folder():
  # sha256, not hash(): the same in every process and on every machine.
  digest = pi.split_digest("cat", "/data/cat/001.jpg")
  assert digest.hex() == "c76645fb8ea8f349ca99a946981523ba"
  assert digest == pi.split_digest("cat", "gs://bucket/images/cat/001.jpg")
  assert digest != pi.split_digest("dog", "/data/cat/001.jpg")
  assert len(digest) == 16


def _candidates(per_class):
  return [pi.Candidate(f"/d/{name}/{i:04d}.jpg", name)
          for name, count in per_class.items() for i in range(count)]


def test_assign_splits_is_stratified_and_close_to_the_fraction():
  candidates = _candidates({"a": 2, "b": 3, "c": 1000, "d": 1})
  splits = pi.assign_splits(candidates, 0.1)
  counts = collections.Counter((c.class_name, splits[c]) for c in candidates)
  for name in "abc":
    assert counts[(name, "train")] >= 1 and counts[(name, "validation")] >= 1
  assert counts[("d", "train")] == 1  # A single image trains.
  assert 70 <= counts[("c", "validation")] <= 130
  assert pi.assign_splits(list(reversed(candidates)), 0.1) == splits


def test_assign_splits_does_not_move_files_when_data_grows():
  before = pi.assign_splits(_candidates({"a": 500}), 0.2)
  after = pi.assign_splits(_candidates({"a": 800}), 0.2)
  assert all(after[c] == split for c, split in before.items())


def test_zero_fraction_puts_everything_in_train():
  splits = pi.assign_splits(_candidates({"a": 5}), 0.0)
  assert set(splits.values()) == {"train"}


def test_choose_num_shards_targets_100_mb():
  big = [pi.Candidate(f"/x/{i}.jpg", "a", 30 * 10**6) for i in range(10)]
  assert pi.choose_num_shards(big) == 3  # 300 MB.
  assert pi.choose_num_shards(big[:1]) == 1
  assert pi.choose_num_shards(big, num_shards=7) == 7
  assert pi.choose_num_shards([]) == 0


def test_csv_shard_count_samples_file_sizes(tmp_path):
  for i in range(3):
    _write(str(tmp_path / f"{i}.jpg"), b"x" * 60 * 10**6)
  candidates = [pi.Candidate(str(tmp_path / f"{i}.jpg"), "a") for i in range(3)]
  assert pi.choose_num_shards(candidates) == 2  # 180 MB.


def test_make_plan_items_carry_label_split_and_shard(image_folder, tmp_path):
  plan = pi.make_plan(str(tmp_path / "out"), input_dir=image_folder,
                      validation_fraction=0.25, num_shards=3)
  assert plan.labels == ("cat", "dog", "ñandú")
  assert plan.num_shards == {"train": 3, "validation": 3}
  assert len(plan.items) == 30 and len(plan.rejected) == 1
  for item in plan.items:
    assert plan.labels[item.label] == item.class_name
    assert 0 <= item.shard < 3 and item.split in layout.SPLITS
  assert plan.output_dir == str(tmp_path / "out")


@pytest.mark.parametrize("kwargs,message", [
    ({}, "give exactly one of --input_dir or --input_csv (got neither)"),
    ({"input_dir": "/a", "input_csv": "/b.csv"}, "(got both)"),
    ({"input_dir": "/no/such/dir"}, "--input_dir=/no/such/dir does not exist"),
    ({"input_csv": "/no/such.csv"}, "--input_csv=/no/such.csv does not exist"),
    ({"input_dir": "IMAGES", "validation_fraction": 1.0},
     "--validation_fraction=1.0 must be >= 0 and < 1"),
    ({"input_dir": "IMAGES", "num_shards": 0},
     "--num_shards=0 must be at least 1"),
    ({"input_dir": "IMAGES", "max_size": -3}, "--max_size=-3 must be"),
    ({"input_dir": "IMAGES", "labels_file": "/no/labels.txt"},
     "--labels_file=/no/labels.txt does not exist"),
])
def test_make_plan_errors_name_the_flag(image_folder, tmp_path, kwargs,
                                        message):
  kwargs = {k: image_folder if v == "IMAGES" else v for k, v in kwargs.items()}
  with pytest.raises(pi.InputError) as raised:
    pi.make_plan(str(tmp_path / "out"), **kwargs)
  assert message in str(raised.value)
  assert not os.path.exists(tmp_path / "out")


def test_empty_inputs_are_errors(tmp_path):
  os.makedirs(tmp_path / "empty" / "cat")
  _write(str(tmp_path / "empty.csv"), "path,label\nonly-one-field\n")
  _write(str(tmp_path / "dup.txt"), "a\nb\na\n")
  with pytest.raises(pi.InputError, match="holds no files in class"):
    pi.make_plan("out", input_dir=str(tmp_path / "empty"))
  with pytest.raises(pi.InputError, match="lists no images"):
    pi.make_plan("out", input_csv=str(tmp_path / "empty.csv"))
  with pytest.raises(pi.InputError, match="lists 'a' more than once"):
    pi.read_labels_file(str(tmp_path / "dup.txt"))


def test_check_output_dir_refuses_a_dataset_unless_overwrite(tmp_path):
  out = tmp_path / "out"
  names = ["manifest.json", "labels.txt", "rejected.csv",
           "train-00000-of-00002.tfrecord",
           "validation-00000-of-00001.tfrecord",
           ".preprocess-temp-abc/part", "keep-me.txt"]
  for name in names:
    _write(str(out / name))
  with pytest.raises(pi.InputError, match=r"already holds a dataset \("
                     r"manifest.json\); pass --overwrite"):
    pi.check_output_dir(str(out), overwrite=False)
  assert sorted(os.listdir(out)) == sorted(
      [".preprocess-temp-abc"] + [n for n in names if "/" not in n])
  pi.check_output_dir(str(out), overwrite=True)
  assert os.listdir(out) == ["keep-me.txt"]
  pi.check_output_dir(str(tmp_path / "new"), overwrite=False)
  assert not os.path.exists(tmp_path / "new")


def test_check_output_dir_refuses_files_and_the_input_tree(image_folder,
                                                          tmp_path):
  _write(str(tmp_path / "file"))
  with pytest.raises(pi.InputError, match="is a file, not a directory"):
    pi.check_output_dir(str(tmp_path / "file"), overwrite=False)
  with pytest.raises(pi.InputError, match="is inside --input_dir"):
    pi.check_output_dir(os.path.join(image_folder, "out"), False,
                        input_dir=image_folder)


def test_conftest_folder_counts_match_the_listing(image_folder):
  candidates, _ = pi.list_folder(image_folder)
  listed = {os.path.relpath(c.path, image_folder) for c in candidates}
  assert set(conftest.IMAGE_FOLDER_REJECTED) - listed == {"README.txt"}
