"""Sends images to a model on TF Serving over REST or gRPC and prints one line per image.

    python -m serving.client --server=localhost:8501 --model=image_classifier \
        --protocol=rest [--batch_size=8] [--signature=serving_default] IMAGE...
    python -m serving.client --server=localhost:8500 --protocol=grpc IMAGE...

Prints `file<TAB>class<TAB>probability` per image. Errors from the server (the
HTTP error body, the gRPC status and details, a refused connection) are
printed to stderr and the exit status is 1; bad flags, and images that cannot
be read or decoded (checked before anything is sent), exit with 2.

Building requests and parsing responses are pure functions, tested without a
server. --signature=predict_images sends images preprocessed here with
preprocess_for_eval, with the central crop (fraction and form) and image size
the served model states (its `preprocessing` signature; an export without one
resized the whole image, at the size its metadata gives, or --image_size;
one without a crop form kept the fraction of each side); every other
signature is sent the encoded bytes, which the model crops itself.

About 390 lines for one idea, talking to TF Serving: the same three steps
(request, call, response) for two protocols, plus the model's metadata.
"""

import argparse
import base64
import collections
import json
import os
import sys
import urllib.error
import urllib.request

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from google.protobuf import json_format
import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from estimator_tpu import serving as serving_lib
from estimator_tpu.data import image_ops
from estimator_tpu.export import contract
from estimator_tpu.export import warmup

PROTOCOLS = ("rest", "grpc")
DEFAULT_BATCH_SIZE = 8
DEFAULT_TIMEOUT_SECS = 60.0
PROG = "python -m serving.client"

Prediction = collections.namedtuple("Prediction", ["label", "classid", "probability"])


class ServingError(Exception):
  """The server answered with an error, or could not be reached."""


class InputError(ValueError):
  """An image given on the command line cannot be read or decoded."""


def batches(items, batch_size):
  """Consecutive lists of at most batch_size items."""
  return [items[i:i + batch_size] for i in range(0, len(items), batch_size)]


def takes_images(signature):
  """Whether the signature takes preprocessed float images rather than encoded bytes."""
  return contract.SIGNATURE_INPUTS.get(signature) == contract.IMAGES


def _prediction(probabilities, classid, label):
  classid = int(classid)
  if isinstance(label, bytes):
    label = label.decode("utf-8", "replace")
  label = str(classid) if label is None else label
  return Prediction(label, classid, float(probabilities[classid]))


def build_rest_body(inputs, signature=contract.SERVING_SIGNATURE):
  """The JSON body of a REST :predict request, in TF Serving's row format.

  Args:
    inputs: encoded images (bytes), sent as {"b64": ...}; or, for
      predict_images, preprocessed float32 arrays [image_size, image_size, 3].
    signature: the signature to run.

  Returns:
    The body as a str: {"signature_name": ..., "instances": [{name: value}, ...]}.
  """
  if takes_images(signature):
    instances = [{contract.IMAGES: image.tolist()} for image in inputs]
  else:
    instances = [{contract.IMAGE_BYTES: {"b64": base64.b64encode(b).decode("ascii")}}
                 for b in inputs]
  return json.dumps({"signature_name": signature, "instances": instances})


def parse_rest_response(text):
  """A REST :predict response body -> [Prediction], one per instance.

  Raises:
    ServingError: the body holds an `error` or no `predictions`.
  """
  try:
    body = json.loads(text)
  except json.JSONDecodeError as e:
    raise ServingError(f"the server's answer is not JSON ({e}): {text[:200]!r}") from e
  if "error" in body or "predictions" not in body:
    raise ServingError(body.get("error", f"no predictions in the answer: {text[:200]!r}"))
  return [_prediction(row[contract.PROBABILITIES], row[contract.CLASSID],
                      row.get(contract.CLASS)) for row in body["predictions"]]


def build_grpc_request(inputs, model, signature=contract.SERVING_SIGNATURE):
  """A gRPC PredictRequest; inputs as for build_rest_body."""
  if not takes_images(signature):
    return warmup.make_predict_request(inputs, model, signature)
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature
  request.inputs[contract.IMAGES].CopyFrom(
      tf.make_tensor_proto(np.stack(inputs).astype(np.float32)))
  return request


def parse_grpc_response(response):
  """A PredictResponse -> [Prediction], one per batch row."""
  outputs = {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}
  labels = outputs.get(contract.CLASS)
  return [_prediction(probabilities, classid, None if labels is None else labels[i])
          for i, (probabilities, classid) in enumerate(
              zip(outputs[contract.PROBABILITIES], outputs[contract.CLASSID]))]


def rest_url(server, model):
  """http://HOST:PORT/v1/models/MODEL:predict (server may carry its own scheme)."""
  base = server if "://" in server else f"http://{server}"
  return f"{base.rstrip('/')}/v1/models/{model}:predict"


def post_rest(server, model, body, timeout=DEFAULT_TIMEOUT_SECS):
  """POSTs a :predict body; returns the response text.

  Raises:
    ServingError: an HTTP error status (with the server's error body) or no connection.
  """
  url = rest_url(server, model)
  request = urllib.request.Request(url, data=body.encode("utf-8"),
                                   headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return response.read().decode("utf-8")
  except urllib.error.HTTPError as e:
    detail = e.read().decode("utf-8", "replace").strip()
    try:
      detail = json.loads(detail).get("error", detail)
    except (json.JSONDecodeError, AttributeError):
      pass
    raise ServingError(f"HTTP {e.code} from {url}: {detail}") from e
  except (urllib.error.URLError, OSError) as e:
    raise ServingError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from e


def _signature_from_map(signatures, signature, where):
  if signature not in signatures.signature_def:
    raise ServingError(f"{where} has no signature {signature!r}; it has "
                       f"{sorted(signatures.signature_def)}")
  return signatures.signature_def[signature]


def fetch_signature(server, model, protocol, signature, timeout=DEFAULT_TIMEOUT_SECS):
  """The served model's SignatureDef, from TF Serving's model metadata (REST or gRPC).

  Raises:
    ServingError: the server cannot be reached, or has no such model or signature.
  """
  signatures, where = fetch_signatures(server, model, protocol, timeout)
  return _signature_from_map(signatures, signature, where)


def fetch_signatures(server, model, protocol, timeout=DEFAULT_TIMEOUT_SECS):
  """(SignatureDefMap, where it came from) of the served model, from its metadata.

  Raises:
    ServingError: the server cannot be reached, or has no such model.
  """
  signatures = get_model_metadata_pb2.SignatureDefMap()
  if protocol == "rest":
    url = rest_url(server, model).rsplit(":predict", 1)[0] + "/metadata"
    try:
      with urllib.request.urlopen(url, timeout=timeout) as response:
        body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
      raise ServingError(f"HTTP {e.code} from {url}: "
                         f"{e.read().decode('utf-8', 'replace').strip()}") from e
    except (urllib.error.URLError, OSError) as e:
      raise ServingError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from e
    json_format.ParseDict(body["metadata"]["signature_def"], signatures,
                          ignore_unknown_fields=True)
    return signatures, url
  request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
  request.model_spec.name = model
  with grpc.insecure_channel(server) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
      response = stub.GetModelMetadata(request, timeout=timeout)
    except grpc.RpcError as e:
      raise ServingError(f"gRPC {e.code().name} from {server}: {e.details()}") from e
  response.metadata["signature_def"].Unpack(signatures)
  return signatures, server


def served_image_size(server, model, protocol, signature, timeout=DEFAULT_TIMEOUT_SECS):
  """The image side the served signature takes, read from the model's metadata."""
  try:
    return contract.image_size_of(fetch_signature(server, model, protocol, signature, timeout))
  except ValueError as e:
    raise ServingError(f"--signature={signature} of model {model}: {e}; "
                       f"give --image_size") from e


def call_signature(server, model, protocol, signature, inputs, timeout=DEFAULT_TIMEOUT_SECS):
  """Runs a signature on encoded images; returns {output key: values of the first row}.

  Raises:
    ServingError: as post_rest / call_grpc.
  """
  if protocol == "rest":
    text = post_rest(server, model, build_rest_body(inputs, signature), timeout)
    try:
      row = json.loads(text)["predictions"][0]
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
      raise ServingError(f"no predictions in the answer: {text[:200]!r}") from e
    return {key: [value] for key, value in row.items()}
  response = call_grpc(server, build_grpc_request(inputs, model, signature), timeout)
  return {key: tf.make_ndarray(proto) for key, proto in response.outputs.items()}


def served_preprocessing(server, model, protocol, signature, image_size=0,
                         timeout=DEFAULT_TIMEOUT_SECS):
  """The crop and size the served model's serving_default applies (contract.Preprocessing).

  Asked of the model's `preprocessing` signature; an export without one
  resized the whole image, at the size `signature`'s metadata gives (or
  image_size, when given).

  Raises:
    ServingError: the server cannot be reached or answers something unusable,
      or image_size disagrees with the size the model states.
  """
  signatures, where = fetch_signatures(server, model, protocol, timeout)
  if contract.PREPROCESSING_SIGNATURE not in signatures.signature_def:
    if not image_size:
      try:
        image_size = contract.image_size_of(_signature_from_map(signatures, signature, where))
      except ValueError as e:
        raise ServingError(f"--signature={signature} of model {model}: {e}; "
                           f"give --image_size") from e
    return contract.Preprocessing(image_size, contract.WHOLE_IMAGE)
  outputs = call_signature(server, model, protocol, contract.PREPROCESSING_SIGNATURE, [b""],
                           timeout)
  try:
    preprocessing = contract.preprocessing_of(outputs)
  except ValueError as e:
    raise ServingError(f"model {model} at {where}: {e}") from e
  if image_size and image_size != preprocessing.image_size:
    raise ServingError(f"--image_size={image_size}, but model {model} takes "
                       f"{preprocessing.image_size} px images: leave --image_size out")
  return preprocessing


def call_grpc(server, request, timeout=DEFAULT_TIMEOUT_SECS):
  """Sends a PredictRequest to PredictionService/Predict; returns the PredictResponse.

  Raises:
    ServingError: the gRPC status code and details (UNAVAILABLE when nothing listens).
  """
  with grpc.insecure_channel(server) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
      return stub.Predict(request, timeout=timeout)
    except grpc.RpcError as e:
      raise ServingError(f"gRPC {e.code().name} from {server}: {e.details()}") from e


def predict(inputs, server, model, protocol, signature=contract.SERVING_SIGNATURE,
            batch_size=DEFAULT_BATCH_SIZE, timeout=DEFAULT_TIMEOUT_SECS):
  """Sends inputs in batches; returns [Prediction] in input order.

  Raises:
    ServingError: as post_rest / call_grpc, or a response of the wrong length.
  """
  predictions = []
  for batch in batches(list(inputs), batch_size):
    if protocol == "rest":
      answer = parse_rest_response(
          post_rest(server, model, build_rest_body(batch, signature), timeout))
    else:
      answer = parse_grpc_response(
          call_grpc(server, build_grpc_request(batch, model, signature), timeout))
    if len(answer) != len(batch):
      raise ServingError(f"sent {len(batch)} images, got {len(answer)} predictions")
    predictions.extend(answer)
  return predictions


def read_inputs(paths, signature=contract.SERVING_SIGNATURE, image_size=0,
                central_fraction=contract.WHOLE_IMAGE, crop_form=contract.OLD_CROP_FORM):
  """Reads the image files and checks that each decodes, before anything is sent.

  With server-side batching an undecodable image fails every request batched
  with it, so it is refused here. For predict_images signatures the images
  are preprocessed here exactly as preprocess_for_eval does, with the model's
  image_size, central_fraction and crop_form (served_preprocessing).

  Returns:
    [bytes], or [float32 array [image_size, image_size, 3]] for predict_images.

  Raises:
    InputError: a file cannot be read or decoded (the message names it).
  """
  inputs = []
  for path in paths:
    try:
      with open(path, "rb") as f:
        image_bytes = f.read()
      if takes_images(signature):
        inputs.append(image_ops.preprocess_for_eval(
            tf.constant(image_bytes), image_size, central_fraction, crop_form).numpy())
      else:
        image_ops.decode_image(tf.constant(image_bytes))
        inputs.append(image_bytes)
    except OSError as e:
      raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    except tf.errors.OpError as e:
      raise InputError(f"{path} is not a decodable image: {serving_lib.error_reason(e)}") from e
  return inputs


def parse_args(argv):
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
  parser.add_argument("--server", required=True, help="HOST:PORT of TF Serving "
                      f"(REST {serving_lib.REST_PORT}, gRPC {serving_lib.GRPC_PORT} by default)")
  parser.add_argument("--model", default=serving_lib.MODEL_NAME, help="model name on the server")
  parser.add_argument("--protocol", choices=PROTOCOLS, default="rest")
  parser.add_argument("--batch_size", type=int, default=DEFAULT_BATCH_SIZE)
  parser.add_argument("--signature", default=contract.SERVING_SIGNATURE)
  parser.add_argument("--image_size", type=int, default=0,
                      help="image side for --signature=predict_images, for an export "
                      "that does not state it (default: what the served model states)")
  parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECS,
                      help="seconds to wait for each batch")
  parser.add_argument("images", nargs="+", metavar="IMAGE", help="JPEG/PNG files")
  args = parser.parse_args(argv)
  if args.batch_size <= 0:
    parser.error(f"--batch_size={args.batch_size} must be positive")
  if takes_images(args.signature) and args.image_size and args.image_size < 8:
    parser.error(f"--signature={args.signature} takes preprocessed images: "
                 f"--image_size={args.image_size} must be the model's image size")
  return args


def main(argv=None):
  """Runs the client; returns the exit status (0 ok, 1 server error, 2 bad input)."""
  args = parse_args(argv)
  preprocessing = contract.Preprocessing(args.image_size, contract.WHOLE_IMAGE)
  if takes_images(args.signature):
    try:
      preprocessing = served_preprocessing(args.server, args.model, args.protocol,
                                           args.signature, args.image_size, args.timeout)
    except ServingError as e:
      print(f"{PROG}: error: {e}", file=sys.stderr)
      return 1
  try:
    inputs = read_inputs(args.images, args.signature, *preprocessing)
  except InputError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  try:
    predictions = predict(inputs, args.server, args.model, args.protocol, args.signature,
                          args.batch_size, args.timeout)
  except ServingError as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 1
  for path, prediction in zip(args.images, predictions):
    print(f"{path}\t{prediction.label}\t{prediction.probability:.4f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
