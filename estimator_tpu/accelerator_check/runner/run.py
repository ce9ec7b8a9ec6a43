"""Runs an accelerator check bundle on this machine's first JAX device, with JAX and NumPy only.

For each precision in the bundle (manifest.json):
  1. losses: regenerates the initial state and the batches from their seeds
     (regenerate.py), runs the lowered training step (exported by
     jax.export on the host, TensorFlow's lowering of the project's step)
     for the bundle's steps, and compares each loss with TensorFlow's own
     run of that step on the host: the first within its target, each later
     one within its target or twice TensorFlow's own spread there (the
     bundle's `reference_spread`: TensorFlow against itself with the images
     moved by `spread_noise`; a randomly started ResNet-50 is chaotic after
     its first update); the plain JAX network (plain_jax.py), started from
     the same values, gives the first loss again;
  2. speed: images/s of the lowered step and of the plain JAX step, both
     under jax.jit with the state donated, each timed over --steps steps
     ending in block_until_ready, warm-up excluded, the two sides
     alternating which goes first, the median of --repeats rounds.

Prints a line per finding and, last, one JSON object: the losses, the
images/s, `ratio_by_precision` (lowered / plain JAX) and `ratio`, the lowest
of them. Exits 1 when a loss misses what it is allowed, 2 when the bundle
cannot run here.

    python BUNDLE/run.py [--repeats=5] [--steps=20] [--warmup=3] [--precisions=float32,bfloat16]

Nothing here imports TensorFlow or the project: copy the bundle directory to
a machine with jax (0.11.2 or later) and numpy, and run it there.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

# The runner's modules are its neighbours in the bundle, which it leaves as it found it; the
# flatbuffers jax.export needs (and jax does not install) is in _vendor, used where Python has none.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_vendor"))
sys.dont_write_bytecode = True

import jax  # noqa: E402
import numpy as np  # noqa: E402
import plain_jax  # noqa: E402
import regenerate  # noqa: E402

MANIFEST = "manifest.json"
FORMAT = 1
# A later step's loss may differ from TensorFlow's by this many times TensorFlow's own spread
# (TensorFlow against itself with the images moved by the bundle's spread_noise).
SPREAD_FACTOR = 2
EXIT_LOSSES = 1
EXIT_UNRUNNABLE = 2


class Unrunnable(Exception):
  """The bundle cannot run on this machine (its platform, its files, its values)."""


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)),
                      help="the bundle directory (default: this file's)")
  parser.add_argument("--repeats", type=int, default=5, help="timed rounds per side (>= 5)")
  parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side first")
  parser.add_argument("--precisions", default="", help="a subset of the bundle's, comma-separated")
  parser.add_argument("--no_speed", action="store_true", help="the loss check only")
  args = parser.parse_args(argv)
  if args.repeats < 5 and not args.no_speed:
    parser.error(f"--repeats={args.repeats}: a median needs >= 5 rounds")
  if args.steps < 1 or args.warmup < 1:
    parser.error("--steps and --warmup must be >= 1")
  return args


def load_manifest(bundle):
  path = os.path.join(bundle, MANIFEST)
  try:
    with open(path) as f:
      manifest = json.load(f)
  except OSError as e:
    raise Unrunnable(f"no bundle at {bundle}: {e}") from None
  if manifest.get("format") != FORMAT:
    raise Unrunnable(f"{path} is format {manifest.get('format')!r}; this runner reads {FORMAT}")
  return manifest


def platform_of(device):
  """jax.export's name of the device's platform: cpu, cuda, rocm or tpu."""
  if device.platform == "gpu":
    return "rocm" if "rocm" in device.client.platform_version.lower() else "cuda"
  return device.platform


def load_export(bundle, file_name, platform):
  with open(os.path.join(bundle, file_name), "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  if platform not in exported.platforms:
    raise Unrunnable(f"{file_name} was lowered for {', '.join(exported.platforms)}; this machine's "
                     f"JAX device is {platform}: build the bundle with --platforms={platform}")
  return exported


def lowered_step(exported):
  """The exported step as `(state, batch) -> (state, loss)` over lists, jitted, state donated."""

  def step(state, batch):
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, [*state, *batch])
    new_state, loss = exported.call(*args, **kwargs)
    return jax.tree_util.tree_leaves(new_state), loss

  return jax.jit(step, donate_argnums=0)


def initial_values(model):
  """The regenerated initial state, checked against the host's checksums."""
  entries = model["state"]
  values = regenerate.initial_state(entries, model["seed"])
  wrong = regenerate.mismatches(values, model["state_checksum"], [e["name"] for e in entries])
  if wrong:
    raise Unrunnable(f"{model['name']}: {len(wrong)} regenerated initial values differ from the "
                     f"host's: {'; '.join(wrong[:3])}")
  return values


def batches(model, count):
  """Steps 0..count-1's regenerated batches; those the host checksummed are checked."""
  found = [regenerate.batch(model["batch"], s, model["batch_seed"]) for s in range(count)]
  names = [f"batch {s} entry {j}" for s in range(count) for j in range(len(model["batch"]))]
  expected = [c for step in model["batch_checksums"][:count] for c in step]
  wrong = regenerate.mismatches([a for b in found for a in b], expected, names)
  if wrong:
    raise Unrunnable(f"{model['name']}: regenerated batches differ from the host's: "
                     f"{'; '.join(wrong[:3])}")
  return found


def plain_start(model, values):
  """(The plain step's initial variables, whether they are the lowered step's: layouts agree)."""
  ours = [(e, v) for e, v in zip(model["state"], values) if e["role"] in regenerate.NETWORK_ROLES]
  layout = plain_jax.layout(model["network"], model["batch"][0]["shape"])
  same = len(ours) == len(layout) and all(
      e["role"] == role and tuple(e["shape"]) == shape
      for (e, _), (role, shape) in zip(ours, layout))
  if same:
    return [v for _, v in ours], True
  entries = [{"name": f"plain {i} {role}", "shape": shape, "dtype": "float32",
              "init": regenerate.init_of(role)} for i, (role, shape) in enumerate(layout)]
  return regenerate.initial_state(entries, model["seed"]), False


def on_device(tree, device):
  return jax.tree_util.tree_map(lambda x: jax.device_put(np.asarray(x), device), tree)


def check_losses(model, exported, device):
  """TensorFlow's losses against the lowered step's, and the plain step's first loss."""
  reference = model["reference_losses"]
  values = initial_values(model)
  data = batches(model, len(reference))
  step = lowered_step(exported)
  state = on_device(values, device)
  ours = []
  for batch in data:
    state, loss = step(state, on_device(batch, device))
    ours.append(float(loss))
  plain_values, same_init = plain_start(model, values)
  plain = plain_jax.PlainStep(model, plain_values)
  _, plain_loss = jax.jit(plain.step)(on_device(plain.state, device), on_device(data[0], device))
  diffs = [abs(a - b) for a, b in zip(ours, reference)]
  first, rest = model["loss_targets"]
  # Later steps: the target, or SPREAD_FACTOR times TensorFlow's own spread where that is more.
  allowed = [first] + [max(rest, SPREAD_FACTOR * s) for s in model["reference_spread"][1:]]
  return {"tf": reference, "ours": ours, "abs_diff": diffs, "targets": [first, rest],
          "targets_met": bool(diffs[0] <= first and all(d <= rest for d in diffs[1:])),
          "tf_spread": model["reference_spread"], "allowed": allowed,
          "pass": bool(all(d <= a for d, a in zip(diffs, allowed))),
          "export": model["exports"]["check"],
          "plain_same_init": same_init, "plain_first_loss": float(plain_loss),
          "plain_first_loss_diff": abs(float(plain_loss) - ours[0]) if same_init else None}


def _timed(fn, state, data, steps):
  start = time.perf_counter()
  for i in range(steps):
    state, _ = fn(state, data[i % len(data)])
  jax.block_until_ready(state)
  return state, time.perf_counter() - start


def measure_speed(model, exported, device, args):
  """{side: median images/s} of the lowered step and the plain JAX step, alternating."""
  values = initial_values(model)
  plain_values, _ = plain_start(model, values)
  plain = plain_jax.PlainStep(model, plain_values)
  data = [on_device(b, device) for b in batches(model, 2)]
  sides = {"ours": [lowered_step(exported), on_device(values, device)],
           "plain_jax": [jax.jit(plain.step, donate_argnums=0), on_device(plain.state, device)]}
  for side in sides.values():
    side[1], _ = _timed(side[0], side[1], data, args.warmup)
  seconds = {name: [] for name in sides}
  for round_ in range(args.repeats):
    for name in (list(sides) if round_ % 2 == 0 else list(reversed(sides))):
      fn, state = sides[name]
      sides[name][1], elapsed = _timed(fn, state, data, args.steps)
      seconds[name].append(elapsed)
  images = args.steps * model["batch"][0]["shape"][0]
  return {name: images / statistics.median(times) for name, times in seconds.items()}


def run(args):
  manifest = load_manifest(args.bundle)
  device = jax.devices()[0]
  platform = platform_of(device)
  wanted = [p for p in args.precisions.split(",") if p]
  models = [m for m in manifest["models"] if not wanted or m["precision"] in wanted]
  if not models:
    raise Unrunnable(f"--precisions={args.precisions}: the bundle has "
                     f"{', '.join(m['precision'] for m in manifest['models'])}")
  print(f"device: {platform} ({device.device_kind}), jax {jax.__version__}; bundle: "
        f"{manifest['network_name']}, batch {models[0]['batch'][0]['shape'][0]}, "
        f"built with {manifest['built_with']}")
  result = {"device": device.device_kind, "platform": platform, "jax": jax.__version__,
            "network": manifest["network_name"], "batch_size": models[0]["batch"][0]["shape"][0],
            "losses": {}, "images_per_s": {}, "ratio_by_precision": {}}
  for model in models:
    precision = model["precision"]
    losses = check_losses(model, load_export(args.bundle, model["exports"]["check"], platform),
                          device)
    result["losses"][precision] = losses
    print(f"{precision} losses: TF {_fmt(losses['tf'])}; lowered {_fmt(losses['ours'])}; "
          f"differences {_fmt(losses['abs_diff'], '.2e')}, allowed {_fmt(losses['allowed'], '.2e')}"
          f" (targets {losses['targets'][0]:g}, then {losses['targets'][1]:g} or {SPREAD_FACTOR}x "
          f"TF's own spread {_fmt(losses['tf_spread'][1:], '.2e')}): "
          f"{'pass' if losses['pass'] else 'FAIL'}"
          f"{'' if losses['targets_met'] else ' (the targets alone: missed)'}")
    if losses["plain_same_init"]:
      print(f"{precision} plain JAX from the same values: first loss "
            f"{losses['plain_first_loss']:.6f} (lowered {losses['ours'][0]:.6f})")
    if args.no_speed:
      continue
    speed = measure_speed(model, load_export(args.bundle, model["exports"]["step"], platform),
                          device, args)
    result["images_per_s"][precision] = speed
    result["ratio_by_precision"][precision] = speed["ours"] / speed["plain_jax"]
    print(f"{precision} images/s (median of {args.repeats}, {args.steps} steps each): lowered "
          f"{speed['ours']:.2f}, plain JAX {speed['plain_jax']:.2f}, "
          f"ratio {result['ratio_by_precision'][precision]:.3f}")
  result["losses_pass"] = all(v["pass"] for v in result["losses"].values())
  result["ratio"] = min(result["ratio_by_precision"].values(), default=None)
  return result


def _fmt(values, form=".6f"):
  return "[" + ", ".join(f"{v:{form}}" for v in values) + "]"


def main(argv=None):
  args = parse_args(argv)
  warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
  try:
    result = run(args)
  except Unrunnable as e:
    print(f"accelerator check: {e}", file=sys.stderr)
    return EXIT_UNRUNNABLE
  print(json.dumps(result))
  return 0 if result["losses_pass"] else EXIT_LOSSES


if __name__ == "__main__":
  sys.exit(main())
