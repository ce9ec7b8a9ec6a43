"""Tests of serving.client: requests decoded exactly as TF Serving decodes them, and its errors.

TF Serving cannot run here, so the fakes of fake_serving.py do what it does
with a request.
"""

import base64
import io
import json
import os
import socket

import fake_serving
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from google.protobuf import text_format
from google.protobuf import wrappers_pb2
import numpy as np
from PIL import Image
import pytest
import sklearn.datasets
import tensorflow as tf
from tensorflow_serving.config import model_server_config_pb2

from estimator_tpu import serving
from estimator_tpu.data import digits as datasets
from estimator_tpu.export import contract
from estimator_tpu.export import warmup
from estimator_tpu.serving import client
from estimator_tpu.serving import predict as predict_lib

IMAGE_SIZE = 32
PHOTO = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", "flower.jpg")


@pytest.fixture(scope="module")
def fake(exported_model):
  return fake_serving.FakeServing(exported_model)


@pytest.fixture(scope="module")
def rest_server(fake):
  with fake_serving.rest_server(fake) as address:
    yield address


@pytest.fixture(scope="module")
def grpc_server(fake):
  with fake_serving.grpc_server(fake) as address:
    yield address


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
  """Five real images: digit JPEGs, a grayscale PNG and scikit-learn's flower photo."""
  folder = tmp_path_factory.mktemp("client_images")
  digits, _ = datasets.digit_arrays(limit=3, size=IMAGE_SIZE)
  paths = []
  for i, digit in enumerate(digits):
    paths.append(folder / f"digit{i}.jpg")
    paths[-1].write_bytes(datasets.encode_jpeg(digit))
  buffer = io.BytesIO()
  Image.fromarray(digits[0][..., 0], "L").save(buffer, format="PNG")
  paths.append(folder / "gray.png")
  paths[-1].write_bytes(buffer.getvalue())
  paths.append(folder / "flower.jpg")
  with open(PHOTO, "rb") as f:
    paths[-1].write_bytes(f.read())
  return [str(p) for p in paths]


@pytest.fixture(scope="module")
def expected(exported_model, image_files):
  """What serving.predict answers for image_files: [(label, classid, probability)]."""
  predictor = predict_lib.Predictor(exported_model)
  results = predictor.predict(client.read_inputs(image_files))
  return [(r.label, r.classid, float(r.probabilities[r.classid])) for r in results]


def assert_same(predictions, expected):
  assert [(p.label, p.classid) for p in predictions] == [(e[0], e[1]) for e in expected]
  np.testing.assert_allclose([p.probability for p in predictions], [e[2] for e in expected],
                             atol=1e-6)


def free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_rest_body_is_tf_serving_row_format(image_files):
  inputs = client.read_inputs(image_files[:2])
  body = json.loads(client.build_rest_body(inputs))
  assert body["signature_name"] == contract.SERVING_SIGNATURE
  assert [list(i) for i in body["instances"]] == [[contract.IMAGE_BYTES]] * 2
  assert [base64.b64decode(i[contract.IMAGE_BYTES]["b64"]) for i in body["instances"]] == inputs


def test_rest_request_decoded_like_tf_serving_matches_serving_predict(
    fake, image_files, expected):
  body = client.build_rest_body(client.read_inputs(image_files))
  assert_same(client.parse_rest_response(fake.rest(body)), expected)


def test_grpc_request_decoded_like_tf_serving_matches_serving_predict(
    fake, image_files, expected):
  request = client.build_grpc_request(client.read_inputs(image_files), serving.MODEL_NAME)
  assert request.model_spec.name == serving.MODEL_NAME
  assert request.model_spec.signature_name == contract.SERVING_SIGNATURE
  assert tf.make_ndarray(request.inputs[contract.IMAGE_BYTES]).shape == (len(image_files),)
  assert_same(client.parse_grpc_response(fake.grpc(request)), expected)


def test_predict_images_requests_give_the_same_answer(fake, image_files, expected):
  signature = contract.PREDICT_IMAGES_SIGNATURE
  images = client.read_inputs(image_files, signature, IMAGE_SIZE)
  assert images[0].shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and images[0].dtype == np.float32
  body = client.build_rest_body(images, signature)
  assert_same(client.parse_rest_response(fake.rest(body)), expected)
  request = client.build_grpc_request(images, serving.MODEL_NAME, signature)
  assert list(request.inputs) == [contract.IMAGES]
  assert_same(client.parse_grpc_response(fake.grpc(request)), expected)


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_main_prints_one_line_per_image(protocol, rest_server, grpc_server, image_files,
                                        expected, capsys):
  server = rest_server if protocol == "rest" else grpc_server
  status = client.main([f"--server={server}", f"--protocol={protocol}", "--batch_size=2"]
                       + image_files)
  lines = capsys.readouterr().out.splitlines()
  assert status == 0
  assert [line.split("\t") for line in lines] == [
      [path, label, f"{probability:.4f}"]
      for path, (label, _, probability) in zip(image_files, expected)]


@pytest.mark.parametrize("protocol,shown", [
    ("rest", "HTTP 404 from http://{server}/v1/models/nope:predict: Servable not found"),
    ("grpc", "gRPC NOT_FOUND from {server}: Servable not found for request: Latest(nope)")])
def test_main_shows_server_errors(protocol, shown, rest_server, grpc_server, image_files,
                                  capsys):
  server = rest_server if protocol == "rest" else grpc_server
  status = client.main([f"--server={server}", "--model=nope", f"--protocol={protocol}",
                        image_files[0]])
  assert status == 1
  assert shown.format(server=server) in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_invalid_argument_from_the_server_is_raised_with_its_message(
    protocol, rest_server, grpc_server):
  server = rest_server if protocol == "rest" else grpc_server
  code = "HTTP 400" if protocol == "rest" else "gRPC INVALID_ARGUMENT"
  with pytest.raises(client.ServingError,
                     match=f"(?s){code} .*Unknown image file format. One of JPEG, .*PNG"):
    client.predict([b"no image"], server, serving.MODEL_NAME, protocol)


@pytest.mark.parametrize("protocol,shown", [("rest", "cannot reach http://localhost:"),
                                            ("grpc", "gRPC UNAVAILABLE from localhost:")])
def test_main_shows_a_refused_connection(protocol, shown, image_files, capsys):
  status = client.main([f"--server=localhost:{free_port()}", f"--protocol={protocol}",
                        "--timeout=20", image_files[0]])
  assert status == 1
  assert shown in capsys.readouterr().err


def test_main_refuses_an_undecodable_file_before_sending(tmp_path, capsys):
  bad = tmp_path / "bad.jpg"
  bad.write_bytes(b"not a jpeg")
  status = client.main([f"--server=localhost:{free_port()}", str(bad)])
  err = capsys.readouterr().err
  assert status == 2
  assert f"{bad} is not a decodable image: Unknown image file format" in err


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_predict_images_takes_the_image_size_from_the_served_model(
    protocol, rest_server, grpc_server, image_files, expected, capsys):
  server = rest_server if protocol == "rest" else grpc_server
  assert client.served_image_size(server, serving.MODEL_NAME, protocol,
                                  contract.PREDICT_IMAGES_SIGNATURE) == IMAGE_SIZE
  status = client.main([f"--server={server}", f"--protocol={protocol}",
                        f"--signature={contract.PREDICT_IMAGES_SIGNATURE}"] + image_files)
  assert status == 0
  assert [line.split("\t")[1] for line in capsys.readouterr().out.splitlines()] == [
      label for label, _, _ in expected]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_image_size_of_a_signature_without_images_names_the_fix(protocol, rest_server,
                                                                grpc_server):
  server = rest_server if protocol == "rest" else grpc_server
  with pytest.raises(client.ServingError,
                     match=r"--signature=serving_default of model .*no 'images' input.*"
                           r"give --image_size"):
    client.served_image_size(server, serving.MODEL_NAME, protocol, contract.SERVING_SIGNATURE)
  with pytest.raises(client.ServingError, match="has no signature 'nope'"):
    client.fetch_signature(server, serving.MODEL_NAME, protocol, "nope")


def test_predict_images_refuses_a_too_small_image_size(image_files, capsys):
  with pytest.raises(SystemExit) as exit_info:
    client.main(["--server=localhost:1", "--signature=predict_images", "--image_size=4",
                 image_files[0]])
  assert exit_info.value.code == 2
  assert "--image_size=4 must be the model's image size" in capsys.readouterr().err


def test_rest_error_body_and_bad_json_are_serving_errors():
  with pytest.raises(client.ServingError, match="boom"):
    client.parse_rest_response('{"error": "boom"}')
  with pytest.raises(client.ServingError, match="not JSON"):
    client.parse_rest_response("<html>")


def test_rest_url_and_batches():
  assert client.rest_url("h:1", "m") == "http://h:1/v1/models/m:predict"
  assert client.rest_url("https://h/", "m") == "https://h/v1/models/m:predict"
  assert client.batches(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


# TF Serving's BatchingParameters (session_bundle_config.proto), which the
# tensorflow-serving-api wheel does not ship: (name, field number, type).
_INT64_VALUE, _STRING_VALUE = ".google.protobuf.Int64Value", ".google.protobuf.StringValue"
_BATCHING_FIELDS = (("max_batch_size", 1, _INT64_VALUE), ("batch_timeout_micros", 2, _INT64_VALUE),
                    ("max_enqueued_batches", 3, _INT64_VALUE),
                    ("num_batch_threads", 4, _INT64_VALUE), ("thread_pool_name", 5, _STRING_VALUE),
                    ("allowed_batch_sizes", 6, "int64"), ("pad_variable_length_inputs", 7, "bool"))


def batching_parameters_class():
  field = descriptor_pb2.FieldDescriptorProto
  proto = descriptor_pb2.FileDescriptorProto(
      name="session_bundle_config.proto", package="tensorflow.serving", syntax="proto3",
      dependency=[wrappers_pb2.DESCRIPTOR.name])
  message = proto.message_type.add(name="BatchingParameters")
  for name, number, kind in _BATCHING_FIELDS:
    message.field.add(
        name=name, number=number,
        label=field.LABEL_REPEATED if name == "allowed_batch_sizes" else field.LABEL_OPTIONAL,
        type=field.TYPE_MESSAGE if kind.startswith(".") else getattr(field, f"TYPE_{kind.upper()}"),
        type_name=kind if kind.startswith(".") else None)
  pool = descriptor_pool.DescriptorPool()
  pool.Add(descriptor_pb2.FileDescriptorProto.FromString(wrappers_pb2.DESCRIPTOR.serialized_pb))
  pool.Add(proto)
  return message_factory.GetMessageClass(
      pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


def test_models_config_parses_as_tf_serving_config():
  with open(serving.MODELS_CONFIG) as f:
    config = text_format.Parse(f.read(), model_server_config_pb2.ModelServerConfig())
  (model,) = config.model_config_list.config
  assert model.name == serving.MODEL_NAME
  assert model.base_path == f"/models/{serving.MODEL_NAME}"
  assert model.model_platform == "tensorflow"


def test_batching_parameters_parse_and_are_consistent():
  with open(serving.BATCHING_PARAMETERS) as f:
    parameters = text_format.Parse(f.read(), batching_parameters_class()())
  sizes = list(parameters.allowed_batch_sizes)
  assert sizes == sorted(sizes) and sizes[-1] == parameters.max_batch_size.value
  assert set(warmup.WARMUP_BATCH_SIZES) <= set(sizes)
  assert parameters.num_batch_threads.value >= 1


def test_readme_commands_match_the_config():
  repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repository, "serving", "README.md")) as f:
    readme = f.read()
  for text in (f"docker run --rm -p {serving.GRPC_PORT}:8500 -p {serving.REST_PORT}:8501",
               serving.SERVING_IMAGE, f"/models/{serving.MODEL_NAME}",
               "--enable_batching --batching_parameters_file=/config/batching_parameters.txt",
               f"localhost:{serving.REST_PORT}/v1/models/{serving.MODEL_NAME}:predict",
               '"image_bytes": {"b64":', "python -m serving.client", "python -m serving.predict",
               "$PWD/estimator_tpu/serving:/config",
               contract.PREDICT_IMAGES_SIGNATURE, "INVALID_ARGUMENT"):
    assert text in readme, text
