"""Fakes of TF Serving's REST and gRPC servers for the serving tests: no TF Serving runs here.

They do what TF Serving does with a request: REST row format with {"b64": ...}
decoded to bytes, gRPC TensorProtos through tf.make_ndarray, then the
SignatureDef run on the SavedModel, and the answer encoded back (REST
`predictions` rows; gRPC TensorProtos); model metadata is the MetaGraphDef's
signatures.
"""

import base64
import concurrent.futures
import contextlib
import http.server
import json
import os
import threading

from google.protobuf import json_format
import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from estimator_tpu import serving
from estimator_tpu.export import contract


class FakeServing:
  """Runs requests through the SavedModel's SignatureDefs the way TF Serving does."""

  def __init__(self, saved_model_dir, model_name=serving.MODEL_NAME):
    self._loaded = tf.saved_model.load(saved_model_dir)
    self.model_name = model_name
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, contract.SAVED_MODEL_FILE), "rb") as f:
      saved.ParseFromString(f.read())
    # What TF Serving reports as the model's metadata: the MetaGraphDef's signatures.
    self.signatures = get_model_metadata_pb2.SignatureDefMap()
    for name, signature_def in saved.meta_graphs[0].signature_def.items():
      self.signatures.signature_def[name].CopyFrom(signature_def)

  def rest_metadata(self):
    """GET /v1/models/NAME/metadata's JSON, with TF Serving's field names."""
    return json.dumps({"model_spec": {"name": self.model_name},
                       "metadata": {"signature_def": json_format.MessageToDict(
                           self.signatures, preserving_proto_field_name=True)}})

  def grpc_metadata(self):
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = self.model_name
    response.metadata["signature_def"].Pack(self.signatures)
    return response

  def run(self, signature, inputs):
    """{input name: ndarray} -> {output name: ndarray}; raises TF errors as the session does."""
    function = self._loaded.signatures[signature]
    outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}

  def rest(self, body):
    """A :predict JSON body -> the JSON answer (row format)."""
    request = json.loads(body)
    columns = {}
    for instance in request["instances"]:
      for name, value in instance.items():
        if isinstance(value, dict) and set(value) == {"b64"}:
          value = base64.b64decode(value["b64"])
        columns.setdefault(name, []).append(value)
    inputs = {name: np.array(values, dtype=object if isinstance(values[0], bytes)
                             else np.float32) for name, values in columns.items()}
    outputs = self.run(request.get("signature_name", contract.SERVING_SIGNATURE), inputs)
    rows = [{key: (value[i].decode() if isinstance(value[i], bytes) else value[i].tolist())
             for key, value in outputs.items()} for i in range(len(request["instances"]))]
    return json.dumps({"predictions": rows})

  def grpc(self, request):
    """A PredictRequest -> PredictResponse."""
    inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
    outputs = self.run(request.model_spec.signature_name or contract.SERVING_SIGNATURE,
                       inputs)
    response = predict_pb2.PredictResponse()
    for key, value in outputs.items():
      response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
    return response


class _RestHandler(http.server.BaseHTTPRequestHandler):
  fake = None

  def do_POST(self):
    body = self.rfile.read(int(self.headers["Content-Length"])).decode()
    if self.path != f"/v1/models/{self.fake.model_name}:predict":
      return self._answer(404, {"error": f"Servable not found for request: {self.path}"})
    try:
      return self._answer(200, self.fake.rest(body))
    except tf.errors.InvalidArgumentError as e:
      return self._answer(400, {"error": e.message})

  def do_GET(self):
    if self.path != f"/v1/models/{self.fake.model_name}/metadata":
      return self._answer(404, {"error": f"Servable not found for request: {self.path}"})
    return self._answer(200, self.fake.rest_metadata())

  def _answer(self, status, body):
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):

  def __init__(self, fake):
    self.fake = fake

  def Predict(self, request, context):
    if request.model_spec.name != self.fake.model_name:
      context.abort(grpc.StatusCode.NOT_FOUND,
                    f"Servable not found for request: Latest({request.model_spec.name})")
    try:
      return self.fake.grpc(request)
    except tf.errors.InvalidArgumentError as e:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT, e.message)

  def GetModelMetadata(self, request, context):
    if request.model_spec.name != self.fake.model_name:
      context.abort(grpc.StatusCode.NOT_FOUND,
                    f"Servable not found for request: Latest({request.model_spec.name})")
    return self.fake.grpc_metadata()


@contextlib.contextmanager
def rest_server(fake):
  """A REST server answering as `fake` on localhost; yields its HOST:PORT."""
  handler = type("Handler", (_RestHandler,), {"fake": fake})
  server = http.server.ThreadingHTTPServer(("localhost", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"localhost:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def grpc_server(fake):
  """A gRPC PredictionService answering as `fake` on localhost; yields its HOST:PORT."""
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      _PredictionService(fake), server)
  port = server.add_insecure_port("localhost:0")
  server.start()
  try:
    yield f"localhost:{port}"
  finally:
    server.stop(None)
