"""Central-crop evaluation travels with the model: eval, export, serving.predict, the client.

One model is trained with --eval_crop=0.875 (a new run: the square form) on
non-square photo-like JPEGs whose outer frame (outside the central 0.875 of
each side) is a loud colour of its own, so a whole-image resize and the
central crop give the network different pixels. Evaluation, the exported
serving_default, the local batch predictor and the REST/gRPC client (against
the fakes of fake_serving.py) must give every photo the same class. The same
model dir made old (its config.json without eval_crop_form) keeps the
per-side form through evaluation, export and serving.
"""

import csv
import json
import os
import re
import shutil

from absl import flags
import fake_serving
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu import serving
from estimator_tpu import testing
from estimator_tpu.cli import export
from estimator_tpu.cli import train
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.export import contract
from estimator_tpu.export import saved_model as export_lib
from estimator_tpu.serving import client
from estimator_tpu.serving import predict as predict_lib

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
    data = json.load(f)["data"]
  assert (data["eval_crop"], data["eval_crop_form"]) == (CROP, image_ops.SQUARE)
  loaded = tf.saved_model.load(version)
  assert predict_lib.model_preprocessing(loaded.signatures) == (
      IMAGE_SIZE, CROP, image_ops.SQUARE)
  outputs = loaded.signatures[contract.PREPROCESSING_SIGNATURE](
      image_bytes=tf.constant([b"", b"x", b""]))
  assert outputs[contract.CENTRAL_FRACTION].dtype == tf.float64
  np.testing.assert_array_equal(outputs[contract.CENTRAL_FRACTION].numpy(), [CROP] * 3)
  np.testing.assert_array_equal(outputs[contract.IMAGE_SIZE].numpy(), [IMAGE_SIZE] * 3)
  np.testing.assert_array_equal(outputs[contract.CROP_FORM].numpy(), [b"square"] * 3)


def served_classes(version, paths, central_fraction, crop_form=image_ops.SQUARE):
  """The classid predict_images gives each photo preprocessed with central_fraction."""
  loaded = tf.saved_model.load(version)
  images = np.stack(client.read_inputs(paths, contract.PREDICT_IMAGES_SIGNATURE, IMAGE_SIZE,
                                       central_fraction, crop_form))
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
  assert (f"the model keeps a central square of {CROP:g} of each image's shorter side "
          f"(--eval_crop), resized to {IMAGE_SIZE}x{IMAGE_SIZE} px") in capsys.readouterr().out
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
                                         contract.PREDICT_IMAGES_SIGNATURE) == (
                                             IMAGE_SIZE, CROP, image_ops.SQUARE)
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


def reference_square(height, width, fraction):
  """tensorflow/tpu's eval window, in numpy: (top, left, side), float32 product truncated."""
  side = int(np.float32(fraction) * np.float32(min(height, width)))
  return (height - side + 1) // 2, (width - side + 1) // 2, side


def central_crop_of(image, fraction, form):
  """The expected crop of a decoded image, each form computed its own way."""
  if form == image_ops.PER_SIDE:
    return tf.image.central_crop(image, fraction)
  top, left, side = reference_square(image.shape[0], image.shape[1], fraction)
  return image[top:top + side, left:left + side]


@pytest.mark.parametrize("form", image_ops.CROP_FORMS)
def test_the_eval_input_decodes_the_central_crop(photos, form):
  _, paths, data_dir = photos
  input_fn = input_pipeline.make_input_fn(
      os.path.join(data_dir, "validation-*"), False, IMAGE_SIZE, num_examples=NUM_PHOTOS,
      global_batch_size=NUM_PHOTOS)
  # The form reaches the input_fn through params, as train.py's config does.
  features, _ = next(iter(input_fn({"batch_size": NUM_PHOTOS, "eval_crop": CROP,
                                    "eval_crop_form": form})))
  other = image_ops.SQUARE if form == image_ops.PER_SIDE else image_ops.PER_SIDE
  for i in (0, 7, 19):
    full = tf.io.decode_jpeg(open(paths[i], "rb").read(), channels=3)
    expected = image_ops.resize_for_eval(central_crop_of(full, CROP, form), IMAGE_SIZE)
    not_expected = image_ops.resize_for_eval(central_crop_of(full, CROP, other), IMAGE_SIZE)
    # decode_and_crop_jpeg's last column may differ by a few levels (libjpeg's
    # chroma upsampling at the window's edge); after resizing, under 0.1 of a std.
    np.testing.assert_allclose(features["image"][i], expected, atol=0.1)
    # The other form's crop is 5x further off (a gradient photo, stretched otherwise).
    assert (np.abs(features["image"][i] - not_expected).max()
            > 5 * np.abs(features["image"][i] - expected).max())
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
  assert predict_lib.model_preprocessing(loaded.signatures)[:2] == (IMAGE_SIZE, 1.0)
  signatures = {name: loaded.signatures[name] for name in
                (contract.SERVING_SIGNATURE, contract.PREDICT_IMAGES_SIGNATURE)}
  assert predict_lib.model_preprocessing(signatures) == (IMAGE_SIZE, 1.0, image_ops.PER_SIDE)


def marked_photo(height, width):
  """uint8 [height, width, 3]: each pixel's row and column in its colour (tells a crop's place)."""
  rows, cols = np.mgrid[0:height, 0:width]
  return np.stack([rows % 256, cols % 256, 40 * (rows // 256) + 80 * (cols // 256)],
                  axis=-1).astype(np.uint8)


@pytest.mark.parametrize("encode", ["png", "jpeg"])
def test_a_500x375_photo_keeps_the_central_328x328_square(encode):
  # 500 wide, 375 high at 0.875: tensorflow/tpu keeps 328x328 from row 24,
  # column 86; the per-side form keeps 438x329 and stretches it.
  pixels = marked_photo(375, 500)
  data = (tf.io.encode_png(pixels) if encode == "png"
          else tf.io.encode_jpeg(pixels, quality=100, chroma_downsampling=False)).numpy()
  full = image_ops.decode_image(tf.constant(data)).numpy()
  crops = {form: image_ops.decode_central_crop(tf.constant(data), CROP, form).numpy()
           for form in image_ops.CROP_FORMS}
  assert crops[image_ops.SQUARE].shape == (328, 328, 3)
  assert crops[image_ops.PER_SIDE].shape == (329, 438, 3)
  # The kept region, told by its pixels: exact from a PNG; from a JPEG (which
  # decodes only the window) within a level or two of the full decode's.
  tolerance = 0 if encode == "png" else 2
  square = crops[image_ops.SQUARE].astype(int)
  np.testing.assert_allclose(square, full[24:352, 86:414], atol=tolerance)
  if encode == "png":
    assert tuple(square[0, 0, :2]) == (24, 86)
    assert tuple(square[-1, -1, :2]) == (351 % 256, 413 % 256)
  np.testing.assert_allclose(crops[image_ops.PER_SIDE], full[23:352, 31:469], atol=tolerance)
  # preprocess_for_eval resizes that region, eagerly and inside Dataset.map alike.
  for form in image_ops.CROP_FORMS:
    eager = image_ops.preprocess_for_eval(tf.constant(data), IMAGE_SIZE, CROP, form).numpy()
    mapped = next(iter(tf.data.Dataset.from_tensors(data).map(
        lambda b, form=form: image_ops.preprocess_for_eval(b, IMAGE_SIZE, CROP, form)))).numpy()
    np.testing.assert_array_equal(eager, mapped)
    np.testing.assert_allclose(
        eager, image_ops.resize_for_eval(crops[form], IMAGE_SIZE).numpy(), atol=1e-5)
  # Without a form, preprocess_for_eval crops per side, as before the choice existed.
  default = image_ops.preprocess_for_eval(tf.constant(data), IMAGE_SIZE, CROP).numpy()
  np.testing.assert_allclose(
      default, image_ops.resize_for_eval(crops[image_ops.PER_SIDE], IMAGE_SIZE), atol=1e-5)
  assert np.abs(default - image_ops.resize_for_eval(crops[image_ops.SQUARE], IMAGE_SIZE)).mean(
      ) > 0.1
  with pytest.raises(ValueError, match=r"crop form 'squar' is not one of square, per_side"):
    image_ops.decode_central_crop(tf.constant(data), CROP, "squar")


def test_square_window_is_tensorflow_tpus_arithmetic():
  for height, width in ((375, 500), (500, 375), (224, 224), (17, 33), (33, 17), (1, 1), (3, 2)):
    for fraction in (0.875, 224 / 256, 0.9, 0.5, 0.01, 1.0):
      window = image_ops.square_window(tf.constant([height, width, 3]), fraction).numpy()
      top, left, side = reference_square(height, width, fraction)
      if side == 0:  # tensorflow/tpu would ask for an empty window; one pixel is kept
        top, left, side = (height - 1 + 1) // 2, (width - 1 + 1) // 2, 1
      assert tuple(window) == (top, left, side, side), (height, width, fraction)
      assert 0 <= window[0] <= height - side and 0 <= window[1] <= width - side


def flag_config(model_dir, *args):
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", f"--model_dir={model_dir}", *args])
  return flags_lib.config_for_model_dir(flag_values)


def test_a_new_run_crops_square_and_an_old_config_json_keeps_the_per_side_form(tmp_path):
  new, saved = flag_config(tmp_path, "--image_size=224")
  assert saved is None and new.data.eval_crop_form == image_ops.SQUARE
  assert new.to_params()["eval_crop_form"] == image_ops.SQUARE
  assert flag_config(tmp_path, "--eval_crop_form=per_side")[0].data.eval_crop_form == "per_side"
  # The form round-trips through config.json.
  config_lib.write_config(new)
  assert config_lib.read_config(str(tmp_path)) == new
  assert flag_config(tmp_path)[0].data.eval_crop_form == image_ops.SQUARE
  # A config.json written before the field: the per-side form, kept on resume.
  old_dir = tmp_path / "old"
  old_dir.mkdir()
  (old_dir / config_lib.CONFIG_FILE).write_text(json.dumps(
      {"data": {"image_size": 224, "eval_crop": CROP}, "runtime": {"model_dir": str(old_dir)}}))
  old, saved = flag_config(old_dir, "--mode=eval")
  assert (old.data.eval_crop, old.data.eval_crop_form) == (CROP, image_ops.PER_SIDE)
  assert old.to_params()["eval_crop_form"] == image_ops.PER_SIDE
  # The other form is refused, naming the flag and the way out.
  other, _ = flag_config(old_dir, "--eval_crop_form=square")
  with pytest.raises(config_lib.ConfigError) as refused:
    config_lib.check_compatible(saved, other)
  assert str(refused.value) == (
      f"--eval_crop_form=square conflicts with eval_crop_form=per_side in "
      f"{old_dir / config_lib.CONFIG_FILE}, which that model is evaluated and served with; "
      f"use another --model_dir or --eval_crop_form=per_side")
  config_lib.check_compatible(saved, flag_config(old_dir, "--eval_crop_form=per_side")[0])
  with pytest.raises(config_lib.ConfigError,
                     match=r"^--eval_crop_form=centre is not one of square, per_side$"):
    flag_config(tmp_path / "new", "--eval_crop_form=centre")[0].validate()


@pytest.fixture(scope="module")
def old_model(tmp_path_factory, crop_model, photos):
  """(model_dir, export version dir) of the crop model as a model dir from before the form.

  Its config.json has no eval_crop_form, as one written before the field; it
  is exported again by export.py.
  """
  model_dir = str(tmp_path_factory.mktemp("old_model") / "model")
  shutil.copytree(crop_model[0], model_dir, ignore=shutil.ignore_patterns("export"))
  path = os.path.join(model_dir, config_lib.CONFIG_FILE)
  with open(path) as f:
    saved = json.load(f)
  del saved["data"]["eval_crop_form"]
  saved["runtime"]["model_dir"] = model_dir
  with open(path, "w") as f:
    json.dump(saved, f)
  export_dir = os.path.join(model_dir, "export")
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["export.py", f"--model_dir={model_dir}", f"--export_dir={export_dir}"])
  assert export.run(flag_values) == 0
  return model_dir, export_lib.latest_export(export_dir)


def assert_serving_is_evaluation(model_dir, version, photos, form):
  """serving_default on the photo bytes == predict_images on the eval input's images."""
  _, paths, data_dir = photos
  config, _ = flag_config(model_dir, "--mode=eval")
  assert config.data.eval_crop_form == form
  input_fn = input_pipeline.make_input_fn(
      os.path.join(data_dir, "validation-*"), False, num_examples=NUM_PHOTOS,
      global_batch_size=NUM_PHOTOS)
  features, _ = next(iter(input_fn(dict(config.to_params(), batch_size=NUM_PHOTOS))))
  loaded = tf.saved_model.load(version)
  assert predict_lib.model_preprocessing(loaded.signatures) == (IMAGE_SIZE, CROP, form)
  served = loaded.signatures[contract.SERVING_SIGNATURE](
      image_bytes=tf.constant([open(p, "rb").read() for p in paths]))
  evaluated = loaded.signatures[contract.PREDICT_IMAGES_SIGNATURE](images=features["image"])
  np.testing.assert_allclose(served[contract.PROBABILITIES], evaluated[contract.PROBABILITIES],
                             atol=1e-5)
  # A client that preprocesses itself, with what the export states, sends the same images.
  client_images = np.stack(client.read_inputs(
      paths, contract.PREDICT_IMAGES_SIGNATURE, *predict_lib.model_preprocessing(
          loaded.signatures)))
  np.testing.assert_allclose(client_images, features["image"], atol=1e-5)


def test_export_and_serving_crop_as_evaluation_in_both_forms(crop_model, old_model, photos):
  assert_serving_is_evaluation(*crop_model, photos, image_ops.SQUARE)
  assert_serving_is_evaluation(*old_model, photos, image_ops.PER_SIDE)
  # The two forms give these photos different pixels (up to 0.3 of a std: smooth
  # gradients, stretched one way or the other), far beyond the tolerance above.
  images = [np.stack(client.read_inputs(photos[1], contract.PREDICT_IMAGES_SIGNATURE,
                                        IMAGE_SIZE, CROP, form))
            for form in image_ops.CROP_FORMS]
  assert np.abs(images[0] - images[1]).max() > 0.2


def test_resuming_an_old_model_dir_with_the_other_form_is_refused(old_model, photos, capsys):
  model_dir, _ = old_model
  _, _, data_dir = photos
  flag_values = flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(["train.py", f"--model_dir={model_dir}", f"--data_dir={data_dir}",
               "--eval_crop_form=square", "--train_steps=12"])
  assert train.run(flag_values) != 0
  lines = capsys.readouterr().err.strip().splitlines()
  assert lines[-1].startswith("train.py: error: --eval_crop_form=square conflicts with "
                              "eval_crop_form=per_side in ")
  assert config_lib.read_config(model_dir).data.eval_crop_form == image_ops.PER_SIDE


def test_an_export_that_states_no_crop_form_is_served_per_side(old_model, tmp_path):
  # An export from before crop_form: the per-side graph, and a preprocessing
  # signature with central_fraction and image_size only.
  version = str(tmp_path / "1")
  shutil.copytree(old_model[1], version)

  def drop_crop_form(signatures, _):
    del signatures[contract.PREPROCESSING_SIGNATURE].outputs[contract.CROP_FORM]

  export_lib._edit_signatures(version, drop_crop_form)
  loaded = tf.saved_model.load(version)
  outputs = loaded.signatures[contract.PREPROCESSING_SIGNATURE](image_bytes=tf.constant([b""]))
  assert set(outputs) == {contract.CENTRAL_FRACTION, contract.IMAGE_SIZE}
  assert predict_lib.model_preprocessing(loaded.signatures) == (
      IMAGE_SIZE, CROP, image_ops.PER_SIDE)
  assert predict_lib.describe_preprocessing(predict_lib.model_preprocessing(
      loaded.signatures)) == (f"the model keeps the central {CROP:g} of each image side "
                              f"(--eval_crop, --eval_crop_form=per_side), resized to "
                              f"{IMAGE_SIZE}x{IMAGE_SIZE} px")
  fake = fake_serving.FakeServing(version)
  with fake_serving.rest_server(fake) as rest, fake_serving.grpc_server(fake) as grpc:
    for server, protocol in ((rest, "rest"), (grpc, "grpc")):
      assert client.served_preprocessing(server, serving.MODEL_NAME, protocol,
                                         contract.PREDICT_IMAGES_SIGNATURE) == (
                                             IMAGE_SIZE, CROP, image_ops.PER_SIDE)


def test_a_stated_crop_form_is_read_from_any_transport_and_checked():
  base = {contract.CENTRAL_FRACTION: [CROP], contract.IMAGE_SIZE: [IMAGE_SIZE]}
  assert contract.preprocessing_of(base).crop_form == image_ops.PER_SIDE
  for stated in (np.array([b"square"], object), ["square"]):
    assert contract.preprocessing_of(dict(base, crop_form=stated)) == (
        IMAGE_SIZE, CROP, image_ops.SQUARE)
  with pytest.raises(ValueError, match=r"gave crop_form='oval', not one of square, per_side"):
    contract.preprocessing_of(dict(base, crop_form=[b"oval"]))
