"""Tests of export_lib: the exported SavedModel's signatures, warm-up file and predictions."""

import io
import os
import re
import sys

from conftest import program_env
import numpy as np
from PIL import Image
import programs
import pytest
import sklearn.datasets
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from estimator_tpu import config as config_lib
from estimator_tpu.data import digits as datasets
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.export import contract
from estimator_tpu.export import saved_model
from estimator_tpu.export import versions
from estimator_tpu.export import warmup
from estimator_tpu.run import assemble

IMAGE_SIZE = 32
NUM_CLASSES = 10
PHOTO = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", "china.jpg")
SAVED_MODEL_CLI = [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]


def read_photo():
  with open(PHOTO, "rb") as f:
    return f.read()


def digit_images(count=6):
  images, _ = datasets.digit_arrays(limit=count, size=IMAGE_SIZE)
  return images


def encode(array, fmt, mode=None):
  buffer = io.BytesIO()
  Image.fromarray(array, mode).save(buffer, format=fmt)
  return buffer.getvalue()


def run_cli(*args):
  # The environment of most of the suite's quiet programs: forked from their zygote (programs.py)
  # rather than from one started for this environment alone.
  env = program_env(TF_CPP_MIN_LOG_LEVEL="3")
  result = programs.run(SAVED_MODEL_CLI + list(args), capture_output=True, text=True,
                          env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  return result.stdout


@pytest.fixture(scope="module")
def signatures(exported_model):
  loaded = tf.saved_model.load(exported_model)
  yield loaded.signatures
  del loaded


def serve(signatures, image_bytes_list):
  outputs = signatures[contract.SERVING_SIGNATURE](
      image_bytes=tf.constant(image_bytes_list))
  return {key: value.numpy() for key, value in outputs.items()}


def test_receiver_feeds_decoded_images_and_offers_the_images_alternative():
  with tf.Graph().as_default():
    receiver = saved_model.make_serving_input_receiver_fn(IMAGE_SIZE)()
    image_bytes = receiver.receiver_tensors[contract.IMAGE_BYTES]
    images = receiver.features[schema.IMAGE_KEY]
    alternative = receiver.receiver_tensors_alternatives[contract.PREDICT_IMAGES_SIGNATURE]
  assert image_bytes.dtype == tf.string and image_bytes.shape.as_list() == [None]
  assert images.dtype == tf.float32
  assert images.shape.as_list() == [None, IMAGE_SIZE, IMAGE_SIZE, 3]
  assert alternative == {contract.IMAGES: images}


def test_export_is_a_complete_numeric_version(exported_model, trained_model_dir):
  export_dir, version = os.path.split(exported_model)
  assert version.isdigit()
  assert os.listdir(export_dir) == [version]  # the staging directory is gone
  extra = os.path.join(exported_model, contract.ASSETS_EXTRA)
  assert sorted(os.listdir(extra)) == sorted([contract.WARMUP_FILE, contract.LABELS_FILE,
                                              versions.SOURCE_FILE])
  record = versions.read_record(exported_model)
  assert record["checkpoint"] == tf.train.latest_checkpoint(trained_model_dir)
  assert record["image_size"] == config_lib.read_config(trained_model_dir).data.image_size
  assert saved_model.latest_export(export_dir) == exported_model
  config = config_lib.read_config(trained_model_dir)
  assert contract.read_labels(exported_model) == list(config.data.class_names)


def _signature_blocks(show_output):
  blocks = re.split(r"signature_def\['([^']+)'\]:", show_output)
  return dict(zip(blocks[1::2], blocks[2::2]))


def _tensor_infos(block, kind):
  pattern = kind + r"\['([^']+)'\] tensor_info:\s+dtype: (\w+)\s+shape: (\([^)]*\))"
  return {name: (dtype, shape) for name, dtype, shape in re.findall(pattern, block)}


def test_saved_model_cli_shows_the_three_signatures(exported_model):
  blocks = _signature_blocks(run_cli("show", "--all", "--dir", exported_model))
  assert sorted(blocks) == [contract.PREDICT_IMAGES_SIGNATURE, contract.PREPROCESSING_SIGNATURE,
                            contract.SERVING_SIGNATURE]
  outputs = {contract.PROBABILITIES: ("DT_FLOAT", f"(-1, {NUM_CLASSES})"),
             contract.CLASSID: ("DT_INT32", "(-1)"),
             contract.CLASS: ("DT_STRING", "(-1)")}
  assert sorted(outputs) == sorted(contract.OUTPUT_KEYS)
  serving_block = blocks[contract.SERVING_SIGNATURE]
  assert _tensor_infos(serving_block, "inputs") == {contract.IMAGE_BYTES: ("DT_STRING", "(-1)")}
  assert _tensor_infos(serving_block, "outputs") == outputs
  images_block = blocks[contract.PREDICT_IMAGES_SIGNATURE]
  assert _tensor_infos(images_block, "inputs") == {
      contract.IMAGES: ("DT_FLOAT", f"(-1, {IMAGE_SIZE}, {IMAGE_SIZE}, 3)")}
  assert _tensor_infos(images_block, "outputs") == outputs
  preprocessing_block = blocks[contract.PREPROCESSING_SIGNATURE]
  assert _tensor_infos(preprocessing_block, "inputs") == {
      contract.IMAGE_BYTES: ("DT_STRING", "(-1)")}
  assert _tensor_infos(preprocessing_block, "outputs") == {
      contract.CENTRAL_FRACTION: ("DT_DOUBLE", "(-1)"), contract.IMAGE_SIZE: ("DT_INT32", "(-1)"),
      contract.CROP_FORM: ("DT_STRING", "(-1)")}
  for block in blocks.values():
    assert "tensorflow/serving/predict" in block


def test_saved_model_cli_run_on_a_photo(exported_model, signatures, tmp_path):
  inputs = tmp_path / "photo.npy"
  # Fixed-width bytes (numpy's S dtype), not an object array: it loads without pickle, which
  # saved_model_cli refuses (TF 2.23) or has no flag to allow (TF 2.15). S drops trailing NUL
  # bytes; a JPEG ends with its EOI marker, FF D9.
  photo = read_photo()
  assert photo.endswith(b"\xff\xd9")
  batch = np.array([photo])
  assert batch.dtype == np.dtype(f"S{len(photo)}") and batch[0] == photo
  np.save(inputs, batch, allow_pickle=False)
  outdir = tmp_path / "out"
  run_cli("run", "--dir", exported_model, "--tag_set", "serve",
          "--signature_def", contract.SERVING_SIGNATURE,
          "--inputs", f"{contract.IMAGE_BYTES}={inputs}", "--outdir", str(outdir))
  probabilities = np.load(outdir / f"{contract.PROBABILITIES}.npy")
  classid = np.load(outdir / f"{contract.CLASSID}.npy")
  assert probabilities.shape == (1, NUM_CLASSES)
  np.testing.assert_allclose(probabilities.sum(axis=1), [1.0], atol=1e-5)
  assert classid.tolist() == [int(np.argmax(probabilities[0]))]
  served = serve(signatures, [photo])  # the same bytes reached the model
  np.testing.assert_allclose(probabilities, served[contract.PROBABILITIES], atol=1e-5)


def test_warmup_requests_parse_and_run(exported_model, signatures):
  path = os.path.join(exported_model, contract.ASSETS_EXTRA, contract.WARMUP_FILE)
  records = [prediction_log_pb2.PredictionLog.FromString(r.numpy())
             for r in tf.data.TFRecordDataset(path)]
  batch_sizes = []
  for log in records:
    request = log.predict_log.request
    assert request.model_spec.signature_name == contract.SERVING_SIGNATURE
    assert list(request.inputs) == [contract.IMAGE_BYTES]
    image_bytes = tf.make_ndarray(request.inputs[contract.IMAGE_BYTES])
    assert all(b[:2] == b"\xff\xd8" for b in image_bytes)  # JPEG start-of-image
    outputs = serve(signatures, list(image_bytes))
    np.testing.assert_allclose(outputs[contract.PROBABILITIES].sum(axis=1), 1.0, atol=1e-5)
    batch_sizes.append(len(image_bytes))
  assert tuple(batch_sizes) == warmup.WARMUP_BATCH_SIZES


def test_saved_model_matches_estimator_predict(trained_model_dir, signatures):
  jpegs = [datasets.encode_jpeg(image) for image in digit_images(9)] + [read_photo()]
  config = config_lib.read_config(trained_model_dir)
  estimator = assemble.build(config)
  expected = list(estimator.predict(
      input_pipeline.make_predict_input_fn(jpegs, config.data.image_size),
      yield_single_examples=True))
  served = serve(signatures, jpegs)
  np.testing.assert_allclose(served[contract.PROBABILITIES],
                             np.stack([p[contract.PROBABILITIES] for p in expected]),
                             rtol=1e-4, atol=1e-6)
  assert served[contract.CLASSID].tolist() == [int(p[contract.CLASSID]) for p in expected]
  assert served[contract.CLASS].tolist() == [p[contract.CLASS] for p in expected]


def test_png_and_grayscale_inputs(signatures):
  rgb = digit_images(1)[0]
  gray = rgb[..., 0]  # the digits are gray: R == G == B
  rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)
  inputs = [encode(rgb, "PNG"), encode(gray, "PNG", "L"), encode(rgba, "PNG", "RGBA"),
            encode(gray, "JPEG", "L"), datasets.encode_jpeg(rgb)]
  probabilities = serve(signatures, inputs)[contract.PROBABILITIES]
  # PNG is lossless, so gray, RGB and RGBA PNGs of one image are the same input.
  np.testing.assert_allclose(probabilities[1], probabilities[0], atol=1e-6)
  np.testing.assert_allclose(probabilities[2], probabilities[0], atol=1e-6)
  np.testing.assert_allclose(probabilities[3], probabilities[4], atol=0.02)
  np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


def test_undecodable_bytes_are_invalid_argument(signatures):
  photo = read_photo()
  with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
    serve(signatures, [photo, b"these bytes are no image"])
  with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid JPEG data"):
    serve(signatures, [photo[:len(photo) // 2]])


def test_predict_images_takes_preprocess_for_eval_output(signatures):
  jpegs = [datasets.encode_jpeg(image) for image in digit_images(4)] + [read_photo()]
  images = tf.stack([image_ops.preprocess_for_eval(b, IMAGE_SIZE) for b in jpegs])
  outputs = signatures[contract.PREDICT_IMAGES_SIGNATURE](images=images)
  served = serve(signatures, jpegs)
  np.testing.assert_allclose(outputs[contract.PROBABILITIES].numpy(),
                             served[contract.PROBABILITIES], atol=1e-6)
  assert outputs[contract.CLASS].numpy().tolist() == served[contract.CLASS].tolist()


def test_make_predict_request_feeds_image_bytes():
  request = warmup.make_predict_request([b"a", b"bc"], "m", "sig")
  assert (request.model_spec.name, request.model_spec.signature_name) == ("m", "sig")
  assert tf.make_ndarray(request.inputs[contract.IMAGE_BYTES]).tolist() == [b"a", b"bc"]


def test_publish_never_overwrites_a_version(tmp_path):
  export_dir = tmp_path / "export"
  (export_dir / "100").mkdir(parents=True)
  staged = tmp_path / "staging" / "100"
  staged.mkdir(parents=True)
  (staged / "saved_model.pb").write_bytes(b"x")
  final = saved_model._publish(str(staged), str(export_dir))
  assert final == str(export_dir / "101")
  assert (export_dir / "101" / "saved_model.pb").read_bytes() == b"x"


def test_rename_signatures_names_a_missing_key(exported_model, tmp_path):
  copy = tmp_path / "copy"
  copy.mkdir()
  with open(os.path.join(exported_model, contract.SAVED_MODEL_FILE), "rb") as f:
    (copy / contract.SAVED_MODEL_FILE).write_bytes(f.read())
  with pytest.raises(ValueError, match="no signature 'absent'"):
    saved_model.rename_signatures(str(copy), {"absent": "x"})


def test_both_signatures_run_in_a_tf1_session_as_tf_serving_runs_them(exported_model):
  jpegs = [datasets.encode_jpeg(image) for image in digit_images(3)]
  images = np.stack([image_ops.preprocess_for_eval(b, IMAGE_SIZE).numpy() for b in jpegs])
  feeds = {contract.SERVING_SIGNATURE: np.array(jpegs, dtype=object),
           contract.PREDICT_IMAGES_SIGNATURE: images}
  answers = {}
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(
        session, [tf.saved_model.SERVING], exported_model)
    for name, value in feeds.items():
      signature = meta_graph.signature_def[name]
      (input_info,) = signature.inputs.values()  # feeding only this input, like TF Serving
      fetches = {key: info.name for key, info in signature.outputs.items()}
      answers[name] = session.run(fetches, {input_info.name: value})
  np.testing.assert_allclose(answers[contract.PREDICT_IMAGES_SIGNATURE][contract.PROBABILITIES],
                             answers[contract.SERVING_SIGNATURE][contract.PROBABILITIES],
                             atol=1e-6)
