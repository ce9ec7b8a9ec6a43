"""Input images/s: the training input_fn vs the same work single-threaded vs training itself.

    python benchmarks/bench_input.py [--jpeg_size=128] [--image_size=32]
        [--batch_size=32] [--batches=200] [--train_steps=60] [--repeats=5]
        [--synthetic]
    python benchmarks/bench_input.py --photos [--image_size=224] [--photo_count=320]
        [--photo_size=500x375] [--batches=60] [--repeats=5] [--full_decode]

Writes the digits as jpeg_size JPEGs with estimator_tpu.testing and measures,
alternating the sides within each of `repeats` rounds:
  input: the training dataset of input_pipeline.make_input_fn alone (parallel
    interleave and maps, AUTOTUNE, prefetch), `batches` batches after warm-up;
  single_threaded: the same decode + preprocess (schema.parse_example,
    image_ops.decode_image and augment_for_train, same shuffle buffer and
    batch) as a tf.data pipeline with no parallel calls, deterministic, one
    private thread, intra-op parallelism 1, no autotuning or injected prefetch;
  train: steady-state images/s of TPUEstimator(use_tpu=False).train of the
    flowers CNN on the same files (a SessionRunHook times the steps after the
    warm-up ones);
  train_synthetic (with --synthetic): the same training fed one cached batch
    repeated, so any gap to `train` is time the step waited for input while
    sharing the cores with it.
Every side also reports the CPU cores it used and images per CPU second (the
machine may be shared). The last line is one JSON object; `ratio` is input ÷
train images/s (the input is not the bottleneck when it is >= 3) and
`input_over_single_threaded` input ÷ single-threaded images/s.

With --photos: photo_count generated textured JPEGs (500x375, ~70 KB, like a
photo of that size; --photo_size=2000x1500 for phone-sized ones; see
_photos.py) cropped and resized to image_size, alternating:
  ours_host: the training dataset of make_input_fn with --augment_on=host (the
    default off TPU): per image, decode of the crop window only (at a reduced
    DCT scale when the window is >= 2x image_size on both sides) and bilinear
    resize to whole pixel values; per batch, flip, colour jitter and
    normalization in one XLA pass; feeds float32;
  reference: tensorflow/tpu's 2018 ResNet training input, written here from
    its published algorithm (reference_dataset): a sample_distorted_bounding_
    box window of 8-100% of the area, aspect 3/4-4/3, 10 attempts, with the
    central-crop fallback; decode_and_crop_jpeg, bicubic resize, random flip;
    files interleaved in parallel, records shuffled, map-and-batch with
    drop_remainder, prefetch. It feeds float32 pixel values 0..255 (its
    model_fn normalizes), so it does less than ours_host: no colour jitter,
    no normalization;
  ours_device: make_input_fn as a TPU run gets it (--augment_on=auto is
    device with --use_tpu): the same crops as bfloat16 pixel values and each
    image's flip, brightness and contrast draws; the accelerator applies them
    in the model_fn;
  ceiling: tf.io.decode_jpeg alone, parallel, over the same records (read,
    parse, decode of the whole image; nothing else);
  full_decode (with --full_decode): the training input as it was before
    decode-and-crop, rebuilt here: every JPEG decoded in full, the decoded
    images shuffled, then per image crop, antialiased resize, flip,
    brightness, contrast and normalization.
The last line is one JSON object: `ratio` is ours_host ÷ reference images/s,
`ours_host_over_ceiling`, `ours_device_over_reference` and the other
`<a>_over_<b>` ratios of medians; the `_cpu` variants are the same per CPU
second, the fairer figure when the machine is shared.
"""

import argparse
import functools
import os
import tempfile

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import _photos
import tensorflow as tf

from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema

WARMUP_BATCHES = 20
TRAIN_WARMUP_STEPS = 20


def single_threaded_dataset(file_pattern, config):
  """The training input_fn's work, one record at a time on one thread."""
  image_size, seed = config.data.image_size, config.train.seed
  random_flip = config.data.random_flip

  def decode(serialized):
    parsed = schema.parse_example(serialized)
    return image_ops.decode_image(parsed["image_bytes"]), parsed["label"]

  def augment(image, label):
    return ({schema.IMAGE_KEY: image_ops.augment_for_train(
        image, image_size, random_flip=random_flip, seed=seed)}, label)

  files = tf.data.Dataset.list_files(file_pattern, shuffle=True, seed=seed)
  dataset = files.flat_map(lambda f: tf.data.TFRecordDataset(
      f, buffer_size=input_pipeline.READ_BUFFER_BYTES))
  dataset = dataset.map(decode)
  dataset = dataset.shuffle(input_pipeline.SHUFFLE_BUFFER, seed=seed).repeat()
  dataset = dataset.map(augment)
  dataset = dataset.batch(config.train.train_batch_size, drop_remainder=True)
  return dataset.with_options(_single_thread_options())


def _single_thread_options():
  options = tf.data.Options()
  options.deterministic = True
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  options.autotune.enabled = False
  options.experimental_optimization.map_parallelization = False
  options.experimental_optimization.inject_prefetch = False
  return options


def time_batches(dataset, batches, batch_size):
  """Images/s of `batches` batches from a fresh iterator, after warm-up ones."""
  iterator = iter(dataset)
  for _ in range(WARMUP_BATCHES):  # shuffle buffer fill, autotuning
    next(iterator)
  start = _common.clocks()
  for _ in range(batches):
    next(iterator)
  return _common.window_figures(start, _common.clocks(), batches * batch_size)


def synthetic_input_fn(input_fn):
  """input_fn's first batch, cached and repeated: training with free input."""

  def synthetic(params):
    return input_fn(params).take(1).cache().repeat()

  return synthetic


def time_train(estimator, input_fn, batch_size, steps):
  figures = _common.time_estimator_train(
      estimator, input_fn, batch_size, TRAIN_WARMUP_STEPS, steps)
  return {"images_per_s": figures["steady_images_per_s"],
          "cores_used": figures["cores_used"],
          "images_per_cpu_s": figures["images_per_cpu_s"],
          "wall_images_per_s": figures["wall_images_per_s"]}


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--jpeg_size", type=int, default=128)
  parser.add_argument("--image_size", type=int, default=None,
                      help="default 32, or 224 with --photos")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--batches", type=int, default=None,
                      help="timed batches per input measurement (default 200, "
                           "60 with --photos)")
  parser.add_argument("--train_steps", type=int, default=60,
                      help="timed steps per training measurement")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--synthetic", action="store_true",
                      help="also time training on one cached batch")
  parser.add_argument("--photos", action="store_true",
                      help="photo JPEGs: ours_host vs the reference vs the decode ceiling")
  parser.add_argument("--photo_count", type=int, default=320)
  parser.add_argument("--photo_size", default=f"{_photos.WIDTH}x{_photos.HEIGHT}",
                      help="with --photos: WIDTHxHEIGHT of the generated JPEGs")
  parser.add_argument("--full_decode", action="store_true",
                      help="with --photos: also time the input before decode-and-crop")
  args = parser.parse_args()
  if args.image_size is None:
    args.image_size = 224 if args.photos else 32
  if args.batches is None:
    args.batches = 60 if args.photos else 200
  if args.batches <= 0 or args.train_steps <= 0:
    parser.error("--batches and --train_steps must be positive")
  try:
    args.photo_width, args.photo_height = (int(n) for n in args.photo_size.split("x"))
  except ValueError:
    parser.error(f"--photo_size={args.photo_size} must be WIDTHxHEIGHT, e.g. 2000x1500")
  return args


def report(name, repeat, figures):
  print(f"  {name:16} run {repeat + 1}: {figures['images_per_s']:8.1f} images/s "
        f"on {figures['cores_used']:.2f} cores", flush=True)


def make_sides(args, work_dir):
  """The (name, fn) pairs to alternate."""
  pattern = _common.write_digits(os.path.join(work_dir, "data"), args.jpeg_size)
  config = _common.make_config(os.path.join(work_dir, "model"), args.image_size,
                               args.batch_size, iterations_per_loop=10)
  input_fn = _common.train_input_fn(config, pattern)
  dataset = input_fn({"batch_size": args.batch_size})
  single = single_threaded_dataset(pattern, config)
  estimator = _common.build_estimator(config)
  estimator.train(input_fn, steps=10)  # untimed: the first checkpoint
  b = args.batch_size
  sides = [
      ("input", lambda: time_batches(dataset, args.batches, b)),
      ("single_threaded", lambda: time_batches(single, args.batches, b)),
      ("train", lambda: time_train(estimator, input_fn, b, args.train_steps)),
  ]
  if args.synthetic:
    synthetic = synthetic_input_fn(input_fn)
    sides.append(("train_synthetic",
                  lambda: time_train(estimator, synthetic, b, args.train_steps)))
  return sides


def summarize(runs, args, load_start):
  result = {"jpeg_size": args.jpeg_size, "image_size": args.image_size,
            "batch_size": args.batch_size, "batches": args.batches,
            "train_steps": args.train_steps, "repeats": args.repeats,
            "cpus": os.cpu_count(), "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average(),
            "single_threaded_kind": "tf.data, num_parallel_calls=None, "
                                    "deterministic, private_threadpool_size=1"}
  for side, side_runs in runs.items():
    result[f"{side}_images_per_s"] = round(_common.median(side_runs, "images_per_s"), 1)
    result[f"{side}_cores_used"] = round(_common.median(side_runs, "cores_used"), 2)
    result[f"{side}_images_per_cpu_s"] = round(
        _common.median(side_runs, "images_per_cpu_s"), 1)
  result["train_wall_images_per_s"] = round(
      _common.median(runs["train"], "wall_images_per_s"), 1)
  result["ratio"] = round(result["input_images_per_s"]
                          / result["train_images_per_s"], 2)
  result["input_over_single_threaded"] = round(
      result["input_images_per_s"] / result["single_threaded_images_per_s"], 2)
  return result


# --- --photos ---------------------------------------------------------------


def _full_decode_augment(image, label, image_size, seed):
  """The per-image training augmentation as it was before fused decoding."""
  image = image_ops.random_crop(image, seed)
  image = tf.image.resize(image, [image_size, image_size],
                          method=tf.image.ResizeMethod.BILINEAR, antialias=True)
  image = tf.image.random_flip_left_right(image, seed=seed)
  image = image / 255.0
  image = tf.image.random_brightness(image, image_ops.BRIGHTNESS_DELTA, seed=seed)
  image = tf.image.random_contrast(image, *image_ops.CONTRAST_RANGE, seed=seed)
  image = image_ops.normalize(tf.clip_by_value(image, 0.0, 1.0) * 255.0)
  image.set_shape([image_size, image_size, 3])
  return {schema.IMAGE_KEY: image}, label


def _decode_record(serialized):
  parsed = schema.parse_example(serialized)
  return image_ops.decode_image(parsed["image_bytes"]), parsed["label"]


def full_decode_dataset(file_pattern, image_size, batch_size, seed):
  """The training input_fn as it was: full decode, decoded images shuffled, per-image work."""
  records = input_pipeline._read_records(file_pattern, True, seed, None)
  dataset = records.map(_decode_record, num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=False)
  dataset = dataset.shuffle(input_pipeline.SHUFFLE_BUFFER, seed=seed).repeat()
  dataset = dataset.map(
      functools.partial(_full_decode_augment, image_size=image_size, seed=seed),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# The reference: tensorflow/tpu's 2018 ResNet training input, written here
# from its published algorithm (a benchmark cannot import third-party code).
REFERENCE_AREA_RANGE = (0.08, 1.0)
REFERENCE_CROP_PADDING = 32  # the central fallback crop: image_size of image_size + 32
REFERENCE_CYCLE_LENGTH = 64  # files read in parallel
REFERENCE_SHUFFLE_BUFFER = 1024


def _reference_central_window(shape, image_size):
  """The central square of image_size / (image_size + 32) of the shorter side."""
  height, width = shape[0], shape[1]
  side = tf.cast(image_size / (image_size + REFERENCE_CROP_PADDING)
                 * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
  return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def reference_preprocess(image_bytes, image_size, seed=None):
  """A random window (area 8-100%, aspect 3/4-4/3, 10 attempts) decoded, bicubic, flipped.

  When all attempts fail, sample_distorted_bounding_box returns the whole
  image and the reference falls back to the central crop. It feeds float32
  pixel values 0..255: its model_fn normalizes.
  """
  shape = tf.io.extract_jpeg_shape(image_bytes, output_type=tf.int32)
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
      min_object_covered=image_ops.CROP_MIN_OBJECT_COVERED,
      aspect_ratio_range=image_ops.CROP_ASPECT_RANGE, area_range=REFERENCE_AREA_RANGE,
      max_attempts=image_ops.CROP_MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True,
      seed=seed)
  sampled = tf.stack([begin[0], begin[1], size[0], size[1]])
  whole_image = tf.reduce_all(tf.equal(size[:2], shape[:2]))
  window = tf.cond(whole_image, lambda: _reference_central_window(shape, image_size),
                   lambda: sampled)
  image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
  image = tf.compat.v1.image.resize_bicubic(image[tf.newaxis], [image_size, image_size])[0]
  image = tf.image.random_flip_left_right(image, seed=seed)
  image.set_shape([image_size, image_size, 3])
  return image


def reference_dataset(file_pattern, image_size, batch_size, seed):
  """Files interleaved in parallel, records shuffled, map-and-batch, prefetch."""

  def parse(serialized):
    parsed = schema.parse_example(serialized)
    return reference_preprocess(parsed["image_bytes"], image_size, seed), parsed["label"]

  files = tf.data.Dataset.list_files(file_pattern, shuffle=True, seed=seed).repeat()
  dataset = files.interleave(
      lambda f: tf.data.TFRecordDataset(f, buffer_size=input_pipeline.READ_BUFFER_BYTES),
      cycle_length=REFERENCE_CYCLE_LENGTH, num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=False)
  dataset = dataset.shuffle(REFERENCE_SHUFFLE_BUFFER, seed=seed)
  dataset = dataset.apply(tf.data.experimental.map_and_batch(
      parse, batch_size, num_parallel_calls=tf.data.AUTOTUNE, drop_remainder=True))
  return dataset.prefetch(tf.data.AUTOTUNE)


def ceiling_dataset(file_pattern, batch_size):
  """tf.io.decode_jpeg alone, parallel: read, parse, decode, keep one pixel."""

  def decode(serialized):
    image = tf.io.decode_jpeg(schema.parse_example(serialized)["image_bytes"], channels=3)
    return image[0, 0]  # the decode runs; nothing is copied after it

  records = input_pipeline._read_records(file_pattern, True, None, None).repeat()
  dataset = records.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def make_photo_sides(args, work_dir):
  pattern, mean_bytes = _photos.write_photo_records(
      os.path.join(work_dir, "photos"), count=args.photo_count,
      width=args.photo_width, height=args.photo_height)
  size, b, seed = args.image_size, args.batch_size, 1
  datasets = {
      "ours_host": input_pipeline.make_input_fn(
          pattern, True, size, seed=seed, augment_on_device=False)({"batch_size": b}),
      "reference": reference_dataset(pattern, size, b, seed),
      "ours_device": input_pipeline.make_input_fn(
          pattern, True, size, seed=seed, augment_on_device=True)({"batch_size": b}),
      "ceiling": ceiling_dataset(pattern, b),
  }
  if args.full_decode:
    datasets["full_decode"] = full_decode_dataset(pattern, size, b, seed)
  sides = [(name, functools.partial(time_batches, dataset, args.batches, b))
           for name, dataset in datasets.items()]
  return sides, mean_bytes


# (JSON key, numerator side, denominator side): `ratio` is the target.
PHOTO_RATIOS = (
    ("ratio", "ours_host", "reference"),
    ("ours_host_over_ceiling", "ours_host", "ceiling"),
    ("ours_device_over_reference", "ours_device", "reference"),
    ("ours_device_over_ceiling", "ours_device", "ceiling"),
    ("reference_over_ceiling", "reference", "ceiling"),
    ("ours_host_over_full_decode", "ours_host", "full_decode"),
)


def summarize_photos(runs, args, load_start, mean_bytes):
  result = {"photos": args.photo_count, "photo_size": args.photo_size,
            "mean_jpeg_bytes": round(mean_bytes), "image_size": args.image_size,
            "batch_size": args.batch_size, "batches": args.batches,
            "repeats": args.repeats, "cpus": os.cpu_count(),
            "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for side, side_runs in runs.items():
    for key in ("images_per_s", "cores_used", "images_per_cpu_s"):
      digits = 2 if key == "cores_used" else 1
      result[f"{side}_{key}"] = round(_common.median(side_runs, key), digits)
  for name, numerator, denominator in PHOTO_RATIOS:
    if denominator not in runs:
      continue
    for key, suffix in (("images_per_s", ""), ("images_per_cpu_s", "_cpu")):
      result[name + suffix] = round(
          result[f"{numerator}_{key}"] / result[f"{denominator}_{key}"], 3)
  return result


def main_photos(args):
  load_start = _common.load_average()
  with tempfile.TemporaryDirectory() as work_dir:
    sides, mean_bytes = make_photo_sides(args, work_dir)
    print(f"{args.photo_count} {args.photo_size} JPEGs (mean "
          f"{mean_bytes / 1000:.1f} KB) -> {args.image_size}x{args.image_size}, batch "
          f"{args.batch_size}; {args.batches} timed batches per run", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize_photos(runs, args, load_start, mean_bytes)
  for side in runs:
    print(f"{side:16} median: {result[f'{side}_images_per_s']:8.1f} images/s on "
          f"{result[f'{side}_cores_used']:.2f} cores "
          f"({result[f'{side}_images_per_cpu_s']:.1f} per CPU second)")
  print(f"ours_host/reference {result['ratio']:.2f} (target >= 1.2; per CPU second "
        f"{result['ratio_cpu']:.2f}), ours_host/ceiling "
        f"{result['ours_host_over_ceiling']:.2f}, ours_device/reference "
        f"{result['ours_device_over_reference']:.2f}")
  _common.print_json(result)


def main():
  args = parse_args()
  _common.quiet_tf()
  if args.photos:
    main_photos(args)
    return
  load_start = _common.load_average()
  with tempfile.TemporaryDirectory() as work_dir:
    sides = make_sides(args, work_dir)
    print(f"{args.jpeg_size}x{args.jpeg_size} digit JPEGs -> {args.image_size}x"
          f"{args.image_size}, batch {args.batch_size}; {args.batches} timed "
          f"batches, {args.train_steps} timed training steps per run", flush=True)
    runs = _common.alternate(sides, args.repeats, report)
  result = summarize(runs, args, load_start)
  for side in runs:
    print(f"{side:16} median: {result[f'{side}_images_per_s']:8.1f} images/s on "
          f"{result[f'{side}_cores_used']:.2f} cores "
          f"({result[f'{side}_images_per_cpu_s']:.1f} per CPU second)")
  print(f"input/train {result['ratio']:.2f} (target >= 3), "
        f"input/single-threaded {result['input_over_single_threaded']:.2f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
