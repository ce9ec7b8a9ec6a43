"""The training-timing flags bench_train.py and bench_stacks.py share (no TensorFlow import)."""


def add_training_timing(parser):
  """Adds --image_size, --batch_size, --iterations_per_loop, --warmup_steps, --steps, --repeats."""
  parser.add_argument("--image_size", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--iterations_per_loop", type=int, default=10)
  parser.add_argument("--warmup_steps", type=int, default=20)
  parser.add_argument("--steps", type=int, default=120)
  parser.add_argument("--repeats", type=int, default=5)


def check_training_timing(parser, args):
  """Warm-up and timed steps must be positive multiples of --iterations_per_loop."""
  for name in ("warmup_steps", "steps"):
    value = getattr(args, name)
    # The window starts after the last warm-up execution: both need >= 1 of them.
    if value <= 0 or value % args.iterations_per_loop:
      parser.error(f"--{name}={value} must be a positive multiple of "
                   f"--iterations_per_loop={args.iterations_per_loop}")
  return args
