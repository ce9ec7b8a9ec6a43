"""Central-crop evaluation travels with the model: eval, export, serving.predict, the client.

One model is trained with --eval_crop=0.875 on photo-like JPEGs whose outer
frame (outside the central 0.875 of each side) is a loud colour of its own,
so a whole-image resize and the central crop give the network different
pixels. Evaluation, the exported serving_default, the local batch predictor
and the REST/gRPC client (against the fakes of fake_serving.py) must give
every photo the same class.
"""

import csv
import json
import os
import re

from absl import flags
import fake_serving
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import testing
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.export import contract
from estimator_tpu.export import saved_model as export_lib
import serving
from serving import client
from serving import predict as predict_lib
import train

CROP = 0.875
IMAGE_SIZE = 32
WIDTH, HEIGHT = 96, 72
NUM_PHOTOS = 20
CLASSES = ["a", "b", "c", "d"]


def photo(rng):
  """uint8 [HEIGHT, WIDTH, 3]: a textured centre and a frame the 0.875 crop leaves out."""
  y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
  image = np.empty((HEIGHT, WIDTH, 3), np.float32)
  for c in range(3):
    a, b = rng.uniform(-80, 80, 2)
    image[..., c] = rng.uniform(60, 200) + a * x / WIDTH + b * y / HEIGHT
  image += rng.normal(0, 6, image.shape)
  # The frame: 5% of each side (the crop removes 6.25%), one loud colour.
  fy, fx = int(HEIGHT * 0.05), int(WIDTH * 0.05)
  frame = np.ones((HEIGHT, WIDTH), bool)
  frame[fy:HEIGHT - fy, fx:WIDTH - fx] = False
  image[frame] = rng.choice([0.0, 255.0], 3)
  return np.clip(image, 0, 255).astype(np.uint8)


def jpeg(array):
  return tf.io.encode_jpeg(array, quality=95).numpy()


def run_train(*args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", "--model=tiny", f"--image_size={IMAGE_SIZE}", "--norandom_flip",
               "--seed=3", "--train_batch_size=8", "--eval_batch_size=8",
               "--summary_every_n_steps=1", *args])
  assert train.run(flag_values) == 0


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  """(folder of NUM_PHOTOS photo files, their paths, the train data dir)."""
  rng = np.random.default_rng(7)
  root = tmp_path_factory.mktemp("crop_photos")
  folder = root / "photos"
  folder.mkdir()
  paths = []
  for i in range(NUM_PHOTOS):
    paths.append(str(folder / f"photo{i:02d}.jpg"))
    with open(paths[-1], "wb") as f:
      f.write(jpeg(photo(rng)))
  train_images = [(jpeg(photo(rng)), i % len(CLASSES)) for i in range(48)]
  eval_images = [(open(p, "rb").read(), 0) for p in paths]
  data_dir = testing.write_dataset(str(root / "data"), {
      "train": (train_images, 2), "validation": (eval_images, 1)}, CLASSES)
  return folder, paths, data_dir


@pytest.fixture(scope="module")
def crop_model(tmp_path_factory, photos):
  """(model_dir, export version dir) of the tiny network trained with --eval_crop=0.875."""
  _, _, data_dir = photos
  model_dir = str(tmp_path_factory.mktemp("crop_model"))
  export_dir = os.path.join(model_dir, "export")
  run_train(f"--data_dir={data_dir}", f"--model_dir={model_dir}", f"--eval_crop={CROP}",
            "--train_steps=6", "--steps_per_eval=6", f"--export_dir={export_dir}")
  return model_dir, export_lib.latest_export(export_dir)


def test_the_crop_is_saved_with_the_run_and_stated_by_the_export(crop_model):
  model_dir, version = crop_model
  with open(os.path.join(model_dir, config_lib.CONFIG_FILE)) as f:
    assert json.load(f)["data"]["eval_crop"] == CROP
  loaded = tf.saved_model.load(version)
  assert predict_lib.model_preprocessing(loaded.signatures) == (IMAGE_SIZE, CROP)
  outputs = loaded.signatures[contract.PREPROCESSING_SIGNATURE](
      image_bytes=tf.constant([b"", b"x", b""]))
  assert outputs[contract.CENTRAL_FRACTION].dtype == tf.float64
  np.testing.assert_array_equal(outputs[contract.CENTRAL_FRACTION].numpy(), [CROP] * 3)
  np.testing.assert_array_equal(outputs[contract.IMAGE_SIZE].numpy(), [IMAGE_SIZE] * 3)


def served_classes(version, paths, central_fraction):
  """The classid predict_images gives each photo preprocessed with central_fraction."""
  loaded = tf.saved_model.load(version)
  images = np.stack(client.read_inputs(paths, contract.PREDICT_IMAGES_SIGNATURE, IMAGE_SIZE,
                                       central_fraction))
  outputs = loaded.signatures[contract.PREDICT_IMAGES_SIGNATURE](images=tf.constant(images))
  return [int(c) for c in outputs[contract.CLASSID].numpy()]


def test_eval_serving_predict_and_the_clients_give_each_photo_the_same_class(
    tmp_path, photos, crop_model, capsys):
  folder, paths, _ = photos
  model_dir, version = crop_model
  # serving.predict: serving_default on the bytes.
  output = tmp_path / "predictions.csv"
  assert predict_lib.main([f"--saved_model={version}", f"--input={folder}",
                           f"--output={output}"]) == 0
  assert (f"the model keeps the central {CROP:g} of each image side (--eval_crop), resized "
          f"to {IMAGE_SIZE}x{IMAGE_SIZE} px") in capsys.readouterr().out
  with open(output) as f:
    rows = {row["id"]: row["label"] for row in csv.DictReader(f)}
  expected = [rows[p] for p in paths]
  # The photos are not all one class, and the frame matters: whole-image
  # preprocessing changes the answer for some of them.
  assert len(set(expected)) > 1
  crop_classes = served_classes(version, paths, CROP)
  assert [CLASSES[c] for c in crop_classes] == expected
  assert served_classes(version, paths, 1.0) != crop_classes

  # The client against TF Serving fakes, both signatures, both protocols: the
  # predict_images requests are cropped here with the crop the model states.
  fake = fake_serving.FakeServing(version)
  with fake_serving.rest_server(fake) as rest, fake_serving.grpc_server(fake) as grpc:
    for server, protocol in ((rest, "rest"), (grpc, "grpc")):
      assert client.served_preprocessing(server, serving.MODEL_NAME, protocol,
                                         contract.PREDICT_IMAGES_SIGNATURE) == (IMAGE_SIZE, CROP)
      for signature in (contract.SERVING_SIGNATURE, contract.PREDICT_IMAGES_SIGNATURE):
        assert client.main([f"--server={server}", f"--protocol={protocol}",
                            f"--signature={signature}", *paths]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split("\t")[1] for line in lines] == expected, (protocol, signature)

  # train.py --mode=eval on the same photos, each labelled with the class
  # serving gave it: every one is right only if evaluation crops as serving does.
  eval_dir = testing.write_dataset(
      str(tmp_path / "relabelled"),
      {"validation": ([(open(p, "rb").read(), crop_classes[i]) for i, p in enumerate(paths)],
                      1)}, CLASSES)
  run_train(f"--model_dir={model_dir}", "--mode=eval", f"--eval_data={eval_dir}/validation-*",
            f"--labels_file={eval_dir}/labels.txt", "--eval_timeout_secs=0")
  captured = capsys.readouterr()
  shown = re.findall(r"\baccuracy=(\d\.\d+)", captured.out + captured.err)
  assert shown and float(shown[-1]) == 1.0


def test_the_eval_input_decodes_the_central_crop(photos):
  _, paths, data_dir = photos
  input_fn = input_pipeline.make_input_fn(
      os.path.join(data_dir, "validation-*"), False, IMAGE_SIZE, num_examples=NUM_PHOTOS,
      global_batch_size=NUM_PHOTOS, eval_crop=CROP)
  features, _ = next(iter(input_fn({"batch_size": NUM_PHOTOS})))
  for i in (0, 7, 19):
    full = tf.io.decode_jpeg(open(paths[i], "rb").read(), channels=3)
    expected = image_ops.resize_for_eval(tf.image.central_crop(full, CROP), IMAGE_SIZE)
    # decode_and_crop_jpeg's last column may differ by a few levels (libjpeg's
    # chroma upsampling at the window's edge); after resizing, under 0.1 of a std.
    np.testing.assert_allclose(features["image"][i], expected, atol=0.1)
    whole = image_ops.resize_for_eval(full, IMAGE_SIZE)
    assert np.abs(features["image"][i] - whole).max() > 1.0


def test_a_new_run_crops_at_photo_sizes_and_an_old_model_dir_keeps_the_whole_image(tmp_path):
  def config(*args, saved=None):
    flag_values = flags.FlagValues()
    flags_lib.define_flags(flag_values)
    flag_values(["train.py", f"--model_dir={tmp_path}", *args])
    return flags_lib.config_from_flags(flag_values, saved=saved)

  assert config("--image_size=224").data.eval_crop == CROP
  assert config("--image_size=128").data.eval_crop == CROP
  assert config("--image_size=127").data.eval_crop == 1.0
  assert config("--image_size=224", "--eval_crop=1.0").data.eval_crop == 1.0
  # A config.json written before the key: whole image, unless the flag says otherwise.
  old = config_lib.Config.from_dict({"data": {"image_size": 224}})
  assert config(saved=old).data.eval_crop == 1.0
  assert config("--eval_crop=0.9", saved=old).data.eval_crop == 0.9
  saved = old.replace("data", eval_crop=0.8)
  assert config(saved=saved).data.eval_crop == 0.8
  for bad in ("0", "1.5", "-0.2"):
    with pytest.raises(config_lib.ConfigError, match=rf"--eval_crop={float(bad)} must be in "
                                                     r"\(0, 1\]"):
      config("--image_size=224", f"--eval_crop={bad}").validate()


def test_central_window_is_tf_image_central_crop():
  for height, width in ((375, 500), (500, 375), (17, 33), (1, 1), (3, 2)):
    image = tf.reshape(tf.range(height * width * 3), [height, width, 3])
    for fraction in (0.875, 0.5, 0.01, 1.0):
      window = image_ops.central_window(tf.shape(image), fraction)
      assert window.numpy()[2:].min() >= 1
      np.testing.assert_array_equal(image_ops.crop_to_window(image, window),
                                    tf.image.central_crop(image, fraction))


def test_an_export_without_the_preprocessing_signature_means_the_whole_image(exported_model):
  # The session export of conftest is a 32 px run: whole image, stated so.
  loaded = tf.saved_model.load(exported_model)
  assert predict_lib.model_preprocessing(loaded.signatures) == (IMAGE_SIZE, 1.0)
  signatures = {name: loaded.signatures[name] for name in
                (contract.SERVING_SIGNATURE, contract.PREDICT_IMAGES_SIGNATURE)}
  assert predict_lib.model_preprocessing(signatures) == (IMAGE_SIZE, 1.0)
