"""Accuracy of central-crop vs whole-image evaluation, on photos whose object leaves a margin.

    python benchmarks/bench_eval_crop.py [--train_photos=480] [--eval_photos=240]
        [--image_size=64] [--steps=300] [--batch_size=32] [--repeats=5]

Generates photo-sized JPEGs (400x300, textured background as _photos.py draws
it) each holding one object whose shape is its class (disc, square, triangle,
cross) in a random colour, 35-60% of the shorter side, placed with
its centre within 12% of the image's centre: the object never fills the frame.
Each repeat trains the flowers CNN from scratch with a different seed
(train.py's input: random crops of 50-100% of the area, flips) at image_size,
then evaluates the same checkpoint twice with the project's eval input:
  crop: --eval_crop=0.875, the central 87.5% of each side decoded and resized;
  whole: --eval_crop=1.0, the whole image resized (evaluation before the flag).
The last line is one JSON object: the medians over repeats of both
accuracies, `ratio` = crop ÷ whole accuracy (medians), `difference` the median
of the per-repeat crop - whole differences, and how many repeats each won.
"""

import argparse
import io
import os
import tempfile

# _common sets TF_CPP_MIN_LOG_LEVEL, so it comes before TensorFlow.
import _common
import _photos
import numpy as np
from PIL import Image
from PIL import ImageDraw

from estimator_tpu import testing
from estimator_tpu.data import input_pipeline

SHAPES = ("disc", "square", "triangle", "cross")
WIDTH, HEIGHT = 400, 300
CROPS = {"crop": 0.875, "whole": 1.0}


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


def train_and_evaluate(args, data_dir, model_dir, seed):
  """{side: accuracy} of one model trained with `seed`, evaluated with each crop."""
  config = _common.make_config(model_dir, args.image_size, args.batch_size,
                               iterations_per_loop=args.steps, train_steps=args.steps)
  config = (config.replace("data", num_label_classes=len(SHAPES), class_names=SHAPES,
                           random_flip=True)
          .replace("train", seed=seed, lr_schedule="cosine")
          .validate())
  estimator = _common.build_estimator(config)
  estimator.train(input_pipeline.make_input_fn(
      os.path.join(data_dir, "train-*"), True, args.image_size, seed=seed),
      max_steps=args.steps)
  accuracies = {}
  for side, crop in CROPS.items():
    eval_fn = input_pipeline.make_input_fn(
        os.path.join(data_dir, "validation-*"), False, args.image_size,
        num_examples=args.eval_photos, global_batch_size=args.batch_size, eval_crop=crop)
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
  return parser.parse_args()


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
      accuracies = train_and_evaluate(args, data_dir, os.path.join(work_dir, f"m{repeat}"),
                                      seed=repeat + 1)
      runs.append(accuracies)
      print(f"  seed {repeat + 1}: crop {accuracies['crop']:.4f}  whole "
            f"{accuracies['whole']:.4f}", flush=True)
  result = {"train_photos": args.train_photos, "eval_photos": args.eval_photos,
            "photo_size": f"{WIDTH}x{HEIGHT}", "image_size": args.image_size,
            "steps": args.steps, "batch_size": args.batch_size, "repeats": args.repeats,
            "cpus": os.cpu_count(), "load_average_1min_start": load_start,
            "load_average_1min_end": _common.load_average()}
  for side in CROPS:
    result[f"{side}_accuracy"] = round(_common.median(runs, side), 4)
  result["ratio"] = round(result["crop_accuracy"] / result["whole_accuracy"], 3)
  result["difference"] = round(float(np.median([r["crop"] - r["whole"] for r in runs])), 4)
  result["crop_wins"] = sum(r["crop"] > r["whole"] for r in runs)
  result["whole_wins"] = sum(r["whole"] > r["crop"] for r in runs)
  print(f"accuracy, median of {args.repeats}: crop {result['crop_accuracy']:.4f}, whole "
        f"{result['whole_accuracy']:.4f}; crop/whole {result['ratio']:.3f}, median "
        f"difference {result['difference']:+.4f}")
  _common.print_json(result)


if __name__ == "__main__":
  main()
