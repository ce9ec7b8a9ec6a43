"""Builds an accelerator check bundle: the JAX engine's ResNet-50 step for a machine with JAX alone.

    .venv-gpu/bin/python benchmarks/accelerator_check/build_bundle.py --out=/tmp/bundle
        [--platforms=cuda,cpu] [--precisions=float32,bfloat16] [--model=resnet]
        [--resnet_depth=50] [--image_size=224] [--batch_size=64] [--num_classes=1000]
        [--steps=5] [--seed=0] [--batch_seed=1] [--base_learning_rate=0.1]

The host lowers the project's training step (TensorFlow's XLA bridge, one
replica, batch per device) for each platform and precision, runs it with
TensorFlow for TensorFlow's reference losses, and writes the bundle
(estimator_tpu/accelerator_check/bundle.py): at most 60 MiB, with its
runner. On the accelerator machine (jax and numpy only):

    python /tmp/bundle/run.py

prints the loss check and images/s against plain JAX, last a JSON object with
`ratio` (benchmarks/README.md). The host needs no accelerator: TensorFlow
lowers the step for its CPU, the same HLO as its GPU and TPU lowerings
(engines/jax/lowering.py), so the current and gpu stacks build bundles for
every platform; the tpu stack cannot (its TensorFlow has no XLA for the CPU).
"""

import argparse
import os
import sys

# Lowering needs no accelerator: JAX stays on the host's CPU (and quiet about the GPU it lacks).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from estimator_tpu.accelerator_check import bundle


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="the bundle directory (new or a bundle's)")
  parser.add_argument("--platforms", default="cuda,cpu", help="of cpu, cuda, rocm, tpu")
  parser.add_argument("--precisions", default="float32,bfloat16")
  parser.add_argument("--model", default="resnet", choices=("resnet", "flowers", "tiny"))
  parser.add_argument("--resnet_depth", type=int, default=50, choices=(18, 34, 50))
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--batch_size", type=int, default=64, help="per device")
  parser.add_argument("--num_classes", type=int, default=1000)
  parser.add_argument("--steps", type=int, default=5, help="TensorFlow's reference steps")
  parser.add_argument("--seed", type=int, default=0, help="of the initial values")
  parser.add_argument("--batch_seed", type=int, default=1, help="of the batches")
  parser.add_argument("--base_learning_rate", type=float, default=0.1,
                      help="constant, times --batch_size / 256 (the project's rule)")
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  try:
    manifest = bundle.build(
        args.out, network=args.model, resnet_depth=args.resnet_depth,
        image_size=args.image_size, batch_size=args.batch_size, num_classes=args.num_classes,
        precision_names=tuple(p for p in args.precisions.split(",") if p),
        platforms=tuple(p for p in args.platforms.split(",") if p), steps=args.steps,
        seed=args.seed, batch_seed=args.batch_seed, base_learning_rate=args.base_learning_rate)
  except bundle.BundleError as e:
    print(f"build_bundle: {e}", file=sys.stderr)
    return 2
  files = sorted(os.listdir(args.out))
  print(f"bundle {args.out}: {manifest['bytes'] / 2 ** 20:.2f} MiB, {len(files)} files "
        f"({', '.join(files)}); run it with: python {os.path.join(args.out, 'run.py')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
