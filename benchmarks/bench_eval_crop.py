"""Accuracy of central-crop (square, per side) vs whole-image evaluation, on photos with a margin.

    python benchmarks/bench_eval_crop.py [--train_photos=480] [--eval_photos=240]
        [--image_size=64] [--steps=300] [--batch_size=32] [--repeats=5]
        [--compare_decode]

Generates photo-sized JPEGs (400x300, textured background as _photos.py draws
it) each holding one object whose shape is its class (disc, square, triangle,
cross) in a random colour, 35-60% of the shorter side, placed with
its centre within 12% of the image's centre: the object never fills the frame.
Each repeat trains the flowers CNN from scratch with a different seed
(train.py's input: random crops of 50-100% of the area, flips) at image_size,
then evaluates the same checkpoint three times with the project's eval input:
  square: --eval_crop=0.875 --eval_crop_form=square (a new run's default, as
    tensorflow/tpu evaluates): a centred square of 87.5% of the shorter side
    (262x262 of 400x300) decoded and resized;
  per_side: --eval_crop_form=per_side (model dirs from before the form): the
    central 87.5% of each side (350x264), stretched to a square by the resize;
  whole: --eval_crop=1.0, the whole image resized (evaluation before the flag).
The last line is one JSON object: the medians over repeats of the
accuracies, `ratio` = square ÷ whole accuracy (medians), `difference` the
median of the per-repeat square - whole differences, how many repeats each
won, and `square_vs_per_side` (square ÷ per_side, medians) with its wins.

With --compare_decode the two sides are instead two trainings per seed,
both evaluated with the square 0.875 crop:
  fast: the training input as it is (JPEG windows decoded with merged chroma
    upsampling, at a reduced DCT scale when the window is at least twice
    image_size: at 64 px most windows of these photos are);
  exact: the same input with libjpeg's default (fancy) upsampling at full
    scale, as training decoded before;
and `ratio` is fast ÷ exact accuracy: what the faster decode costs, if anything.
"""

import argparse
import contextlib
import io
import os
import tempfile

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import _photos
import numpy as np
from PIL import Image
from PIL import ImageDraw
import tensorflow as tf

from estimator_tpu import testing
from estimator_tpu.data import image_ops
from estimator_tpu.data import input_pipeline

SHAPES = ("disc", "square", "triangle", "cross")
WIDTH, HEIGHT = 400, 300
# side: (--eval_crop, --eval_crop_form)
CROPS = {"square": (0.875, image_ops.SQUARE), "per_side": (0.875, image_ops.PER_SIDE),
         "whole": (1.0, image_ops.SQUARE)}


def draw_object(draw, shape, box, colour):
  """Draws one filled shape inside box = (left, top, right, bottom)."""
  left, top, right, bottom = box
  side = right - left
  if shape == "disc":
    draw.ellipse(box, fill=colour)
  elif shape == "square":
    draw.rectangle(box, fill=colour)
  elif shape == "triangle":
    draw.polygon([(left, bottom), (right, bottom), ((left + right) / 2, top)], fill=colour)
  else:  # a cross
    third = side / 3
    draw.rectangle((left + third, top, right - third, bottom), fill=colour)
    draw.rectangle((left, top + third, right, bottom - third), fill=colour)


def object_photo(rng, label):
  """JPEG bytes: a textured background with one object of class `label` near the centre."""
  image = Image.fromarray(_photos.photo_array(rng, WIDTH, HEIGHT))
  side = int(min(WIDTH, HEIGHT) * rng.uniform(0.35, 0.60))
  cx = WIDTH / 2 + rng.uniform(-0.12, 0.12) * WIDTH
  cy = HEIGHT / 2 + rng.uniform(-0.12, 0.12) * HEIGHT
  box = (int(cx - side / 2), int(cy - side / 2), int(cx + side / 2), int(cy + side / 2))
  colour = tuple(int(c) for c in rng.integers(0, 256, 3))
  draw_object(ImageDraw.Draw(image), SHAPES[label], box, colour)
  buffer = io.BytesIO()
  image.save(buffer, format="JPEG", quality=_photos.JPEG_QUALITY)
  return buffer.getvalue()


def write_data(out_dir, train_photos, eval_photos):
  rng = np.random.default_rng(0)
  splits = {"train": ([(object_photo(rng, i % len(SHAPES)), i % len(SHAPES))
                       for i in range(train_photos)], 4),
            "validation": ([(object_photo(rng, i % len(SHAPES)), i % len(SHAPES))
                            for i in range(eval_photos)], 1)}
  return testing.write_dataset(out_dir, splits, list(SHAPES))


@contextlib.contextmanager
def exact_training_decode():
  """While the training graph is built: full-scale decodes with fancy upsampling."""
  fancy, dct_scale = image_ops.JPEG_FANCY_UPSCALING, image_ops.dct_scale
  image_ops.JPEG_FANCY_UPSCALING = True
  image_ops.dct_scale = lambda window, image_size: tf.constant(1)
  try:
    yield
  finally:
    image_ops.JPEG_FANCY_UPSCALING, image_ops.dct_scale = fancy, dct_scale


def train_and_evaluate(args, data_dir, model_dir, seed, crops=None, exact_decode=False):
  """{side: accuracy} of one model trained with `seed`, evaluated with each crop."""
  config = _common.make_config(model_dir, args.image_size, args.batch_size,
                               iterations_per_loop=args.steps, train_steps=args.steps)
  config = (config.replace("data", num_label_classes=len(SHAPES), class_names=SHAPES,
                           random_flip=True)
          .replace("train", seed=seed, lr_schedule="cosine")
          .validate())
  estimator = _common.build_estimator(config)
  decode = exact_training_decode() if exact_decode else contextlib.nullcontext()
  with decode:
    estimator.train(input_pipeline.make_input_fn(
        os.path.join(data_dir, "train-*"), True, args.image_size, seed=seed),
        max_steps=args.steps)
  accuracies = {}
  for side, (crop, form) in (crops or CROPS).items():
    eval_fn = input_pipeline.make_input_fn(
        os.path.join(data_dir, "validation-*"), False, args.image_size,
        num_examples=args.eval_photos, global_batch_size=args.batch_size, eval_crop=crop,
        eval_crop_form=form)
    results = estimator.evaluate(
        eval_fn, steps=input_pipeline.eval_steps(args.eval_photos, args.batch_size))
    accuracies[side] = float(results["accuracy"])
  return accuracies


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--train_photos", type=int, default=480)
  parser.add_argument("--eval_photos", type=int, default=240)
  parser.add_argument("--image_size", type=int, default=64)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--compare_decode", action="store_true",
                      help="fast vs exact training decode, both evaluated with the square crop")
  return parser.parse_args()


def run_repeat(args, data_dir, work_dir, repeat):
  """{side: accuracy} of one seed."""
  model_dir = os.path.join(work_dir, f"m{repeat}")
  if not args.compare_decode:
    return train_and_evaluate(args, data_dir, model_dir, seed=repeat + 1)
  crop = {"square": CROPS["square"]}
  sides = [("fast", False), ("exact", True)]
  if repeat % 2:  # alternate which trains first
    sides.reverse()
  return {side: train_and_evaluate(args, data_dir, f"{model_dir}{side}", repeat + 1, crop,
                                   exact_decode=exact)["square"]
          for side, exact in sides}


def main():
  args = parse_args()
  _common.quiet_tf()
  load_start = _common.load_average()
  runs = []
  with tempfile.TemporaryDirectory() as work_dir:
    data_dir = write_data(os.path.join(work_dir, "data"), args.train_photos, args.eval_photos)
    print(f"{args.train_photos} training and {args.eval_photos} evaluation {WIDTH}x{HEIGHT} "
          f"photos, {len(SHAPES)} shapes; {args.steps} steps of batch {args.batch_size} at "
          f"{args.image_size} px per repeat", flush=True)
    for repeat in range(args.repeats):
      accuracies = run_repeat(args, data_dir, work_dir, repeat)
      runs.append(accuracies)
      print(f"  seed {repeat + 1}: " + "  ".join(
          f"{side} {value:.4f}" for side, value in accuracies.items()), flush=True)
  result = {"train_photos": args.train_photos, "eval_photos": args.eval_photos,
            "photo_size": f"{WIDTH}x{HEIGHT}", "image_size": args.image_size,
            "steps": args.steps, "batch_size": args.batch_size, "repeats": args.repeats,
            "cpus": os.cpu_count(), "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  first, second = ("fast", "exact") if args.compare_decode else ("square", "whole")
  result["compared"] = f"{first} vs {second}"
  for side in (first, second):
    result[f"{side}_accuracy"] = round(_common.median(runs, side), 4)
  result["ratio"] = round(result[f"{first}_accuracy"] / result[f"{second}_accuracy"], 3)
  result["difference"] = round(float(np.median([r[first] - r[second] for r in runs])), 4)
  result[f"{first}_wins"] = sum(r[first] > r[second] for r in runs)
  result[f"{second}_wins"] = sum(r[second] > r[first] for r in runs)
  if not args.compare_decode:
    result["per_side_accuracy"] = round(_common.median(runs, "per_side"), 4)
    result["square_vs_per_side"] = round(result["square_accuracy"]
                                         / result["per_side_accuracy"], 3)
    result["square_wins_over_per_side"] = sum(r["square"] > r["per_side"] for r in runs)
    result["per_side_wins_over_square"] = sum(r["per_side"] > r["square"] for r in runs)
  print(f"accuracy, median of {args.repeats}: {first} {result[f'{first}_accuracy']:.4f}, "
        f"{second} {result[f'{second}_accuracy']:.4f}; {first}/{second} "
        f"{result['ratio']:.3f}, median difference {result['difference']:+.4f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
