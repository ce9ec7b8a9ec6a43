"""The serving contract: signature names, input and output keys, and the files beside an export.

One definition shared by the exporter, the warm-up writer, model_fn's
predictions, the REST/gRPC client and the local batch predictor:

  serving_default  inputs  image_bytes   string  [batch]  JPEG/PNG/GIF/BMP bytes,
                                                  central crop and resize done inside
  predict_images   inputs  images        float32 [batch, image_size, image_size, 3]
                   already cropped, resized and normalized: the output of
                   image_ops.preprocess_for_eval(bytes, image_size, central_fraction,
                   crop_form) with the model's values (below)
  both             outputs probabilities float32 [batch, num_classes]
                           classid       int32   [batch]
                           class         string  [batch]  (when class names are known)
  preprocessing    inputs  image_bytes   string  [batch]  (any bytes; not decoded)
                   outputs central_fraction float64 [batch]  the run's --eval_crop (exact)
                           image_size       int32   [batch]
                           crop_form        string  [batch]  the run's --eval_crop_form:
                                            square or per_side (exports without it
                                            crop per_side)
                   what serving_default does to an image, for a client that
                   preprocesses itself; one row per input, so TF Serving's REST
                   row format carries it (exports without it resize the whole image)

and assets.extra/ with TF Serving's warm-up requests and labels.txt.
"""

import collections
import os

import tensorflow as tf

from estimator_tpu.data import image_ops
from estimator_tpu.data import layout

IMAGE_BYTES = "image_bytes"
IMAGES = "images"
PROBABILITIES = "probabilities"
CLASSID = "classid"
CLASS = "class"
OUTPUT_KEYS = (PROBABILITIES, CLASSID, CLASS)
SERVING_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
PREDICT_IMAGES_SIGNATURE = "predict_images"
PREPROCESSING_SIGNATURE = "preprocessing"
CENTRAL_FRACTION = "central_fraction"
IMAGE_SIZE = "image_size"
CROP_FORM = "crop_form"
# Every export with a preprocessing signature states these; crop_form came later.
PREPROCESSING_OUTPUTS = (CENTRAL_FRACTION, IMAGE_SIZE)
SIGNATURE_INPUTS = {SERVING_SIGNATURE: IMAGE_BYTES, PREDICT_IMAGES_SIGNATURE: IMAGES,
                    PREPROCESSING_SIGNATURE: IMAGE_BYTES}
# The central fraction of an export that has no preprocessing signature: exports
# made before it resized the whole image.
WHOLE_IMAGE = 1.0
# The crop form of an export whose preprocessing signature has no crop_form:
# exports made before it kept central_fraction of each side.
OLD_CROP_FORM = image_ops.PER_SIDE

# What serving_default does to an image before the network: keep the central
# `central_fraction` in `crop_form` (image_ops.preprocess_for_eval), resize to
# image_size x image_size.
Preprocessing = collections.namedtuple("Preprocessing", [IMAGE_SIZE, CENTRAL_FRACTION, CROP_FORM],
                                       defaults=[OLD_CROP_FORM])
SAVED_MODEL_FILE = "saved_model.pb"
ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
# The class names beside an export: a labels file of data/layout.py's format.
LABELS_FILE = layout.LABELS_FILE


def write_labels(version_dir, class_names):
  """Writes assets.extra/labels.txt: class names, one a line, in classid order."""
  directory = os.path.join(version_dir, ASSETS_EXTRA)
  tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(os.path.join(directory, LABELS_FILE), "w") as f:
    f.write(layout.format_labels(class_names))


def read_labels(version_dir):
  """The class names in version_dir/assets.extra/labels.txt, or None when absent."""
  path = os.path.join(version_dir, ASSETS_EXTRA, LABELS_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return list(layout.parse_labels(f.read(), path))


def image_size_of(signature_def):
  """The image side a predict_images SignatureDef takes (its `images` input [batch, S, S, 3]).

  Args:
    signature_def: a meta_graph_pb2.SignatureDef, e.g. from TF Serving's model
      metadata or a SavedModel's MetaGraphDef.

  Raises:
    ValueError: the signature has no `images` input of static shape [-1, S, S, 3].
  """
  if IMAGES not in signature_def.inputs:
    raise ValueError(f"the signature has no {IMAGES!r} input; it has "
                     f"{sorted(signature_def.inputs)}")
  dims = [d.size for d in signature_def.inputs[IMAGES].tensor_shape.dim]
  if len(dims) != 4 or dims[1] <= 0 or dims[1] != dims[2] or dims[3] != 3:
    raise ValueError(f"{IMAGES!r} has shape {dims}, not [batch, S, S, 3]")
  return dims[1]


def preprocessing_of(outputs):
  """Preprocessing from the preprocessing signature's outputs (one row each, any batch).

  Args:
    outputs: {CENTRAL_FRACTION: [batch] values, IMAGE_SIZE: [batch] values,
      CROP_FORM: [batch] bytes or str (absent: OLD_CROP_FORM)} as arrays or
      lists, from a local call, a gRPC or a REST response.

  Raises:
    ValueError: an output is missing, empty or out of range.
  """
  missing = [key for key in PREPROCESSING_OUTPUTS if key not in outputs or not len(outputs[key])]
  if missing:
    raise ValueError(f"the {PREPROCESSING_SIGNATURE!r} signature gave no {missing}")
  fraction = float(outputs[CENTRAL_FRACTION][0])
  size = int(outputs[IMAGE_SIZE][0])
  if not 0 < fraction <= 1 or size <= 0:
    raise ValueError(f"the {PREPROCESSING_SIGNATURE!r} signature gave {CENTRAL_FRACTION}="
                     f"{fraction}, {IMAGE_SIZE}={size}: not a crop in (0, 1] and a size")
  form = OLD_CROP_FORM
  if CROP_FORM in outputs and len(outputs[CROP_FORM]):
    form = outputs[CROP_FORM][0]
    form = form.decode("utf-8", "replace") if isinstance(form, bytes) else str(form)
  if form not in image_ops.CROP_FORMS:
    raise ValueError(f"the {PREPROCESSING_SIGNATURE!r} signature gave {CROP_FORM}={form!r}, "
                     f"not one of {', '.join(image_ops.CROP_FORMS)}")
  return Preprocessing(size, fraction, form)
