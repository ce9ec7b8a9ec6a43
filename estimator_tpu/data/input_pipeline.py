"""make_input_fn(...) -> input_fn(params): TFRecords to static-shape batches for TPUEstimator."""

import math

import numpy as np
import tensorflow as tf

from estimator_tpu import tf_startup
from estimator_tpu.data import image_ops
from estimator_tpu.data import schema

SHUFFLE_BUFFER = 1024
READ_BUFFER_BYTES = 8 * 1024 * 1024
CYCLE_LENGTH = 16
# Streams of stateless draw keys under one --seed (deterministic input): the
# crop windows of images and the augmentations of batches.
CROP_STREAM = 0
AUGMENTATION_STREAM = 1

# The functions this module maps hold no Python control flow on tensors (image_ops
# branches with tf.cond and tf.switch_case), so AutoGraph's conversion of them and
# of everything they call, about 2 CPU seconds the first time a process builds a
# pipeline, would change nothing but the time: they are traced as written.
_as_written = tf.autograph.experimental.do_not_convert


def eval_steps(num_examples, global_batch_size):
  """Evaluation steps that cover num_examples once, the last batch padded."""
  return max(1, math.ceil(num_examples / global_batch_size))


def cycle_seed(seed, step):
  """The input seed of a training cycle that starts at global step `step`.

  Each train() call builds its input pipeline anew, so one seed for every
  call would replay the same files, shuffle and crops in every cycle of
  --steps_per_eval steps: on a large set, training would only ever see the
  first cycle's images. The seed of a cycle is the run's seed mixed with the
  step it starts at (the run's seed itself at step 0), so a run resumed at a
  cycle's start sees what the uninterrupted run saw. None stays None.
  """
  if seed is None or step == 0:
    return seed
  return int(np.random.SeedSequence([seed, step]).generate_state(1)[0] >> 1)


def transpose_to_hwcn(images):
  """[batch, height, width, 3] -> [height, width, 3, batch], the TPU-friendly layout."""
  return tf.transpose(images, [1, 2, 3, 0])


def transpose_from_hwcn(images):
  """Undoes transpose_to_hwcn: [height, width, 3, batch] -> [batch, height, width, 3]."""
  return tf.transpose(images, [3, 0, 1, 2])


def host_of(context):
  """(number of hosts, this host) of a PER_HOST_V2 input_fn call; (1, 0) off a pod."""
  if context is None or getattr(context, "num_hosts", 1) <= 1:
    return 1, 0
  return context.num_hosts, context.current_host


def _records(file_names, deterministic):
  """The records of a Dataset of file names, CYCLE_LENGTH files read at a time."""
  return file_names.interleave(
      _as_written(lambda f: tf.data.TFRecordDataset(f, buffer_size=READ_BUFFER_BYTES)),
      cycle_length=CYCLE_LENGTH, num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=deterministic)


def training_files_by_host(files, num_hosts):
  """Each host's training files, [[path, ...] per host], or None when it shards by record.

  Hosts shard by file when there are at least as many non-empty files as
  hosts: every num_hosts-th file of the sorted list, the same on every host.
  """
  files = sorted(files)
  if num_hosts > 1:
    files = [f for f in files if tf.io.gfile.stat(f).length > 0]
  if len(files) < num_hosts:
    return None
  return [files[host::num_hosts] for host in range(num_hosts)]


def _read_records(file_pattern, is_training, seed, context, deterministic=False):
  """This host's records: disjoint from every other host's, together all of them.

  On a pod each host calls the input_fn (PER_HOST_V2). Training with at least
  as many non-empty files as hosts gives each host every hosts-th non-empty
  file of the sorted list, so no file is read twice in an epoch and no host
  is left with only empty files, and shuffles only its own files; its files'
  records interleave in whatever order they are read, or, when
  `deterministic`, in a fixed order.
  Evaluation, and training with fewer files than hosts, give each host every
  hosts-th record of the same deterministic stream over all files: exact, and
  no host is left without records (every host reads every file, though).
  """
  files = sorted(tf.io.gfile.glob(file_pattern))
  if not files:
    raise ValueError(f"no files match {file_pattern}")
  hosts, host = host_of(context)
  by_host = training_files_by_host(files, hosts) if is_training else None
  if by_host is not None:
    mine = by_host[host]
    names = tf.data.Dataset.from_tensor_slices(mine).shuffle(
        len(mine), seed=seed, reshuffle_each_iteration=True)
    return _records(names, deterministic=deterministic)
  names = tf.data.Dataset.from_tensor_slices(files)
  return _records(names, deterministic=True).shard(hosts, host)


def _decode(serialized):
  parsed = schema.parse_example(serialized)
  return image_ops.decode_image(parsed["image_bytes"]), parsed["label"]


def map_drawing(dataset, fn, seed, deterministic, stream):
  """dataset.map(fn) in parallel, where fn(*element, key) draws random numbers.

  By default key is None: fn draws from stateful ops (op-level `seed`), and
  elements come out in the order they finish. With `deterministic`, elements
  come out in order and fn gets a stateless key, `seed` and `stream` folded
  with the element's position in the dataset, so its draws do not depend on
  which thread ran first; the map stays parallel (under op determinism a map
  with stateful random ops runs on one thread).

  Args:
    dataset: a tf.data.Dataset.
    fn: element components..., key -> the mapped element.
    seed: the run's seed (an int, required with deterministic).
    deterministic: keyed draws and ordered output, as above.
    stream: which of the run's key streams (CROP_STREAM, AUGMENTATION_STREAM).
  """
  if not deterministic:
    return dataset.map(_as_written(lambda *element: fn(*element, None)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  base = tf.constant([seed, stream], tf.int64)

  def keyed(position, element):
    element = element if isinstance(element, tuple) else (element,)
    return fn(*element, tf.random.experimental.stateless_fold_in(base, position))

  return dataset.enumerate().map(_as_written(keyed), num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True)


def _train_images(records, image_size, cache, seed, dtype=tf.uint8, deterministic=False):
  """Shuffled, repeated ([image_size, image_size, 3] random crop of dtype, label) pairs.

  The shuffle buffer holds serialized records, not decoded images, and each
  JPEG decodes only its crop window, at a reduced DCT scale when the window
  is at least twice image_size (image_ops.decode_random_crop). With `cache`,
  every image is decoded in full, exactly, once and cropped from memory in
  each epoch instead. `deterministic`: see map_drawing.
  """
  if cache:
    dataset = records.map(_as_written(_decode), num_parallel_calls=tf.data.AUTOTUNE).cache()
    dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed).repeat()
    return map_drawing(
        dataset, lambda image, label, key: (image_ops.resize_crop(
            image_ops.random_crop(image, seed, key), image_size, dtype), label),
        seed, deterministic, CROP_STREAM)

  def decode_crop(serialized, key):
    parsed = schema.parse_example(serialized)
    crop = image_ops.decode_random_crop(parsed["image_bytes"], seed, image_size, key)
    return image_ops.resize_crop(crop, image_size, dtype), parsed["label"]

  dataset = records.shuffle(SHUFFLE_BUFFER, seed=seed).repeat()
  return map_drawing(dataset, decode_crop, seed, deterministic, CROP_STREAM)


def _augmented_batches(dataset, batch_size, random_flip, seed, deterministic=False):
  """Batches of uint8 crops -> ({image: augmented float32 batch}, labels)."""
  tf_startup.quiet_first_xla_compile()  # augment_batch is XLA-compiled
  # XLA needs fixed shapes: drop_remainder makes the batch dimension static.
  dataset = dataset.batch(batch_size, drop_remainder=True)
  return map_drawing(
      dataset, lambda images, labels, key: ({schema.IMAGE_KEY: image_ops.augment_batch(
          images, random_flip=random_flip, seed=seed, key=key)}, labels),
      seed, deterministic, AUGMENTATION_STREAM)


def _batches_to_augment_on_device(dataset, batch_size, random_flip, seed, deterministic=False):
  """Batches of bfloat16 crops -> ({image: the crops, augmentation: draws}, labels).

  The host only draws each image's flip, brightness and contrast (a few
  numbers); device_augmentation applies them inside the model_fn.
  """
  dataset = dataset.batch(batch_size, drop_remainder=True)
  return map_drawing(
      dataset, lambda images, labels, key: ({
          schema.IMAGE_KEY: images,
          schema.AUGMENTATION_KEY: image_ops.draw_augmentation(
              batch_size, random_flip=random_flip, seed=seed, key=key)}, labels),
      seed, deterministic, AUGMENTATION_STREAM)


def _eval_images(records, image_size, cache, central_fraction, crop_form):
  """(preprocess_for_eval output, label) per record, in order: serving's preprocessing."""

  def preprocess(serialized):
    parsed = schema.parse_example(serialized)
    return (image_ops.preprocess_for_eval(parsed["image_bytes"], image_size, central_fraction,
                                          crop_form),
            parsed["label"])

  dataset = records.map(_as_written(preprocess), num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.cache() if cache else dataset


def host_eval_examples(num_examples, global_batch_size, num_hosts=1):
  """Examples one host feeds in evaluation: eval_steps x its share of the global batch.

  Each host holds at most ceil(num_examples / num_hosts) real records, which
  never exceeds this, so padding can always fill it.
  """
  return eval_steps(num_examples, global_batch_size) * (global_batch_size // num_hosts)


def _pad_eval(dataset, image_size, num_examples, global_batch_size, num_hosts=1):
  """Weights real examples 1, appends weight-0 examples up to this host's exact quota."""
  total = host_eval_examples(num_examples, global_batch_size, num_hosts)
  real = dataset.map(_as_written(
      lambda image, label: ({schema.IMAGE_KEY: image, schema.WEIGHT_KEY: 1.0}, label)))
  padding = tf.data.Dataset.from_tensors((
      {schema.IMAGE_KEY: tf.zeros([image_size, image_size, 3], tf.float32),
       schema.WEIGHT_KEY: 0.0},
      tf.constant(0, tf.int32))).repeat()
  return real.concatenate(padding).take(total)


def make_input_fn(file_pattern, is_training, image_size=None, num_examples=None,
                  global_batch_size=None, cache=False, transpose_input=None,
                  random_flip=True, seed=None, augment_on_device=None, eval_crop=None,
                  deterministic=False, eval_crop_form=None):
  """Builds the input_fn TPUEstimator calls with params['batch_size'] per shard.

  Args:
    file_pattern: glob of TFRecord files (local or gs://).
    is_training: shuffle, repeat forever and augment; else one exact, padded pass.
    image_size: side of the square images fed to the network; None (what
      train.py passes): params['image_size'], from the run's config.
    num_examples: evaluation only: records in the set, so the pass can be
      padded to whole global batches and every record counts exactly once.
    global_batch_size: evaluation only: the batch over all shards.
    cache: keep images in memory after the first epoch: in training every
      image decoded in full (each epoch then crops it without decoding), in
      evaluation the preprocessed images.
    transpose_input: emit images as [height, width, 3, batch]; model_fn undoes
      it. None: params['transpose_input'] (False when absent).
    random_flip: training only: random left/right flips.
    seed: seed for file order, shuffling and augmentation (None: random).
    augment_on_device: training only: leave flip, colour jitter and
      normalization to the model_fn's accelerator (features then hold
      bfloat16 pixel values 0..255 and `augmentation`, which the estimators
      of engines/choose.py apply before the model_fn sees them).
      None: params['augment_on_device'] (False when absent).
    eval_crop: evaluation only: the central fraction kept before resizing
      (preprocess_for_eval's central_fraction; 1.0: the whole image).
      None: params['eval_crop'] (1.0 when absent).
    deterministic: training only: the same seed gives the same batches in
      the same order, however the threads run: files interleave in a fixed
      order, and each image's crop and each batch's augmentation are drawn
      with stateless ops keyed by the seed and their position in the stream
      (map_drawing). Needs a seed.
    eval_crop_form: evaluation only: image_ops.SQUARE (a centred square of
      eval_crop x the shorter side) or image_ops.PER_SIDE (eval_crop of each
      side); preprocess_for_eval's crop_form. None: params['eval_crop_form']
      (PER_SIDE when absent, what params from before the field meant).

  Returns:
    input_fn(params) -> tf.data.Dataset of (features, labels). Features is a
    dict: `image` float32 [batch, image_size, image_size, 3] (or transposed)
    and, in evaluation, `weight` float32 [batch] (0 for padding); training on
    the device: `image` bfloat16 and `augmentation` float32 [batch, 3]. Labels are
    int32 [batch], 0-based. Every shape is fully static.
  """
  if not is_training and (num_examples is None or global_batch_size is None):
    raise ValueError("an evaluation input_fn needs num_examples and global_batch_size")
  if is_training and deterministic and seed is None:
    raise ValueError("a deterministic training input_fn needs a seed")

  def input_fn(params):
    batch_size = params["batch_size"]
    size = image_size or params["image_size"]
    transpose = (params.get("transpose_input", False) if transpose_input is None
                 else transpose_input)
    on_device = (params.get("augment_on_device", False) if augment_on_device is None
                 else augment_on_device)
    records = _read_records(file_pattern, is_training, seed, params.get("context"),
                            deterministic)
    if is_training and on_device:
      dataset = _train_images(records, size, cache, seed, tf.bfloat16, deterministic)
      dataset = _batches_to_augment_on_device(dataset, batch_size, random_flip, seed,
                                              deterministic)
    elif is_training:
      dataset = _train_images(records, size, cache, seed, deterministic=deterministic)
      dataset = _augmented_batches(dataset, batch_size, random_flip, seed, deterministic)
    else:
      crop = params.get("eval_crop", 1.0) if eval_crop is None else eval_crop
      form = (params.get("eval_crop_form", image_ops.PER_SIDE) if eval_crop_form is None
              else eval_crop_form)
      dataset = _eval_images(records, size, cache, crop, form)
      hosts, _ = host_of(params.get("context"))
      dataset = _pad_eval(dataset, size, num_examples, global_batch_size, hosts)
      # XLA needs fixed shapes: drop_remainder makes the batch dimension static.
      dataset = dataset.batch(batch_size, drop_remainder=True)
    if transpose:
      dataset = dataset.map(_as_written(
          lambda feats, labels: (
              dict(feats, **{schema.IMAGE_KEY: transpose_to_hwcn(feats[schema.IMAGE_KEY])}),
              labels)),
          num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return input_fn


def make_predict_input_fn(image_bytes_list, image_size, central_fraction=1.0,
                          crop_form=image_ops.PER_SIDE):
  """input_fn for estimator.predict over a list of encoded images (no padding needed).

  central_fraction, crop_form: as preprocess_for_eval's (the run's eval_crop
  and eval_crop_form).
  """

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices(list(image_bytes_list))
    dataset = dataset.map(_as_written(lambda b: {schema.IMAGE_KEY: image_ops.preprocess_for_eval(
        b, image_size, central_fraction, crop_form)}))
    return dataset.batch(params.get("batch_size", 64))

  return input_fn
