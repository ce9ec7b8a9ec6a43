"""Tests of serving.predict: folders, globs, CSV and TFRecord inputs to a predictions CSV."""

import csv
import glob
import io
import os
import re

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from estimator_tpu.data import digits as datasets
from estimator_tpu.export import contract
from estimator_tpu.serving import predict

IMAGE_SIZE = 32
NUM_CLASSES = 10
CLASSES = [str(i) for i in range(NUM_CLASSES)]
CORRUPT = "corrupt.jpg"


def read_csv(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def predictor(exported_model):
  return predict.Predictor(exported_model)


@pytest.fixture(scope="module")
def class_folders(tmp_path_factory):
  """12 digit images in class folders (JPEGs and one grayscale PNG), plus a truncated JPEG."""
  root = tmp_path_factory.mktemp("class_folders")
  images, labels = datasets.digit_arrays(limit=12, size=IMAGE_SIZE)
  for i, (image, label) in enumerate(zip(images, labels)):
    folder = root / str(label)
    folder.mkdir(exist_ok=True)
    if i == 5:
      buffer = io.BytesIO()
      Image.fromarray(image[..., 0], "L").save(buffer, format="PNG")
      (folder / f"{i:02d}.png").write_bytes(buffer.getvalue())
    else:
      (folder / f"{i:02d}.jpg").write_bytes(datasets.encode_jpeg(image))
  truncated = datasets.encode_jpeg(images[0])
  (root / "3" / CORRUPT).write_bytes(truncated[:len(truncated) // 2])
  (root / "notes.txt").write_text("not an image: ignored")
  return str(root)


def direct_answers(exported_model, paths):
  """{path: (class, probability)} straight from the serving_default signature."""
  loaded = tf.saved_model.load(exported_model)
  image_bytes = [open(p, "rb").read() for p in paths]
  outputs = loaded.signatures[contract.SERVING_SIGNATURE](image_bytes=tf.constant(image_bytes))
  probabilities = outputs[contract.PROBABILITIES].numpy()
  return {p: (c.decode(), float(probabilities[i].max()))
          for i, (p, c) in enumerate(zip(paths, outputs[contract.CLASS].numpy()))}


def test_folder_with_a_corrupt_file(exported_model, class_folders, tmp_path, capsys):
  output = str(tmp_path / "preds.csv")
  status = predict.main([f"--saved_model={exported_model}", f"--input={class_folders}",
                         f"--output={output}", "--batch_size=4", "--progress_secs=0"])
  captured = capsys.readouterr()
  assert status == 0
  rows = read_csv(output)
  assert list(rows[0]) == ["id", "label", "probability", "error"]
  bad = [r for r in rows if r["id"].endswith(CORRUPT)]
  good = [r for r in rows if not r["id"].endswith(CORRUPT)]
  assert len(bad) == 1 and len(good) == 12
  assert bad[0]["label"] == "" and bad[0]["probability"] == ""
  assert bad[0]["error"] == "jpeg::Uncompress failed. Invalid JPEG data or crop window."
  expected = direct_answers(exported_model, [r["id"] for r in good])
  for row in good:
    assert row["error"] == ""
    assert row["label"] == expected[row["id"]][0]
    assert float(row["probability"]) == pytest.approx(expected[row["id"]][1], abs=1e-6)
  correct = sum(r["label"] == os.path.basename(os.path.dirname(r["id"])) for r in good)
  assert "13 rows" in captured.out and "1 error" in captured.out
  assert f"accuracy {correct / 12:.4f} ({correct}/12 labelled images" in captured.out
  assert "13/13 images, 1 error" in captured.err  # progress on stderr


def test_all_probabilities_columns_are_named_by_class(exported_model, class_folders, tmp_path):
  output = str(tmp_path / "preds.csv")
  assert predict.main([f"--saved_model={os.path.dirname(exported_model)}",
                       f"--input={class_folders}/*/*.jpg", f"--output={output}",
                       "--all_probabilities"]) == 0
  rows = read_csv(output)
  assert list(rows[0]) == ["id", "label", "probability"] + CLASSES + ["error"]
  assert len(rows) == 12  # 11 JPEG digits and the corrupt file; not the PNG
  assert [r["id"] for r in rows if r["error"]] == [os.path.join(class_folders, "3", CORRUPT)]
  for row in (r for r in rows if not r["error"]):
    probabilities = np.array([float(row[c]) for c in CLASSES])
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-4)
    assert float(row[row["label"]]) == pytest.approx(float(row["probability"]))


def test_csv_input_with_labels(exported_model, class_folders, tmp_path, capsys):
  listing = tmp_path / "list.csv"
  paths = sorted(glob.glob(os.path.join(class_folders, "*", "*.jpg")))[:5]
  lines = ["path,label"] + [f"{os.path.relpath(p, tmp_path)},{os.path.basename(os.path.dirname(p))}"
                            for p in paths]
  listing.write_text("\n".join(lines) + "\n")
  output = str(tmp_path / "preds.csv")
  assert predict.main([f"--saved_model={exported_model}", f"--input={listing}",
                       f"--output={output}"]) == 0
  rows = read_csv(output)
  assert [r["id"] for r in rows] == [os.path.relpath(p, tmp_path) for p in paths]
  assert all(r["label"] in CLASSES for r in rows)
  correct = sum(r["label"] == os.path.basename(os.path.dirname(r["id"])) for r in rows)
  assert f"({correct}/5 labelled images" in capsys.readouterr().out


def test_tfrecord_input_uses_filenames_and_labels(exported_model, digits_dir, tmp_path, capsys):
  output = str(tmp_path / "preds.csv")
  assert predict.main([f"--saved_model={exported_model}",
                       f"--input={digits_dir}/validation-*", f"--output={output}"]) == 0
  rows = read_csv(output)
  assert len(rows) == 37
  assert rows[0]["id"] == "validation0/0000.jpg"
  out = capsys.readouterr().out
  assert "37 rows" in out and "/37 labelled images" in out


def test_unlabelled_glob_prints_no_accuracy(exported_model, class_folders, tmp_path, capsys):
  output = str(tmp_path / "preds.csv")
  assert predict.main([f"--saved_model={exported_model}",
                       f"--input={class_folders}/3/*.jpg", f"--output={output}"]) == 0
  out = capsys.readouterr().out
  assert "accuracy" not in out
  assert len(read_csv(output)) == 2  # a digit 3 and the corrupt file


def test_a_failing_batch_is_retried_image_by_image(predictor, class_folders):
  good = sorted(glob.glob(os.path.join(class_folders, "*", "*.jpg")))[:3]
  image_bytes = [open(p, "rb").read() for p in good]
  results = predictor.predict(image_bytes[:2] + [b"garbage"] + image_bytes[2:])
  assert [r.error is None for r in results] == [True, True, False, True]
  # TF 2.15 lists JPEG, PNG, GIF, BMP; TF 2.21 adds JPEG XL and WebP.
  assert re.fullmatch(r"Unknown image file format\. One of JPEG, .*PNG, GIF, BMP.* required\.",
                      results[2].error), results[2].error
  alone = predictor.predict(image_bytes)
  np.testing.assert_allclose(results[3].probabilities, alone[2].probabilities, atol=1e-6)


@pytest.mark.parametrize("flags,shown", [
    (["--saved_model={tmp}/missing", "--input={tmp}"],
     "--saved_model={tmp}/missing is not a directory"),
    (["--saved_model={tmp}", "--input={tmp}"],
     "--saved_model={tmp} holds neither saved_model.pb"),
    (["--saved_model={model}", "--input={tmp}/nothing-*"],
     "--input={tmp}/nothing-* matches no files"),
    (["--saved_model={model}", "--input={tmp}/list.csv"],
     "--input={tmp}/list.csv does not exist"),
    (["--saved_model={model}", "--input={tmp}", "--batch_size=0"],
     "--batch_size=0 must be positive"),
])
def test_bad_flags_print_one_line_and_exit_2(flags, shown, exported_model, tmp_path, capsys):
  values = {"tmp": str(tmp_path), "model": exported_model}
  argv = [flag.format(**values) for flag in flags] + [f"--output={tmp_path}/p.csv"]
  assert predict.main(argv) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1
  assert shown.format(**values) in err


def test_empty_folder_is_a_bad_flag(exported_model, tmp_path, capsys):
  assert predict.main([f"--saved_model={exported_model}", f"--input={tmp_path}",
                       f"--output={tmp_path}/p.csv"]) == 2
  assert f"--input={tmp_path} holds no images" in capsys.readouterr().err


def test_probability_columns_avoid_fixed_names():
  assert predict.probability_columns(["cat", "label", "error"]) == [
      "cat", "probability_label", "probability_error"]
