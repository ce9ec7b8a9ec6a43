"""A bundle's initial values and batches, regenerated from seeds: the rule both sides follow.

A bundle ships no weights and no images: the host that builds it and the
machine that runs it both compute them here, with NumPy alone, from the
seeds and shapes in manifest.json.

Each variable of the step's state has a role (its kind, from its name on
the host) and the role an init: kernels "fan_in_normal", batch-norm gamma
and moving variance "ones", the rest "zeros" (beta, biases, moving means,
optimizer slots, the global step, anything else).

Initial values, variable i of the step's state (manifest order), its `init`:
  - "fan_in_normal": numpy.random.RandomState(stream(seed, i)).standard_normal(shape)
    times sqrt(2 / fan_in), fan_in = the product of all dims but the last
    (He's normal for HWIO convolution and [in, out] dense kernels);
  - "ones" (batch-norm gamma and moving variance), "zeros" (everything else:
    beta, biases, moving means, optimizer slots, the global step).
Batches, step s (0-based), flat entry j, its `fill`:
  - "normal": RandomState(stream(batch_seed, s, j)).standard_normal(shape);
  - "labels": RandomState(stream(batch_seed, s, j)).randint(0, high, shape).

NumPy's legacy RandomState is used because its streams are frozen (NumPy's
NEP 19): a newer NumPy on the runner gives the same numbers. Values are
drawn in float64 and then cast to the entry's dtype.
"""

import zlib

import numpy as np

FAN_IN_NORMAL = "fan_in_normal"
ONES = "ones"
ZEROS = "zeros"
INITS = (FAN_IN_NORMAL, ONES, ZEROS)
KERNEL = "kernel"
GAMMA = "gamma"
BETA = "beta"
BIAS = "bias"
MOVING_MEAN = "moving_mean"
MOVING_VARIANCE = "moving_variance"
SLOT = "slot"
STEP = "step"
OTHER = "other"
# The network's variables: what a plain version of the network has too.
NETWORK_ROLES = (KERNEL, GAMMA, BETA, BIAS, MOVING_MEAN, MOVING_VARIANCE)
INIT_OF_ROLE = {KERNEL: FAN_IN_NORMAL, GAMMA: ONES, MOVING_VARIANCE: ONES}
NORMAL = "normal"
LABELS = "labels"


def init_of(role):
  """The init of a role: fan_in_normal, ones or zeros."""
  return INIT_OF_ROLE.get(role, ZEROS)


def stream(*numbers):
  """A RandomState seed (< 2**32) for non-negative integers: CRC-32 of their decimal text."""
  return zlib.crc32(",".join(str(int(n)) for n in numbers).encode("ascii"))


def initial_value(entry, index, seed):
  """The initial value of state entry `index` ({"shape", "dtype", "init"}) for seed."""
  shape, dtype, init = tuple(entry["shape"]), np.dtype(entry["dtype"]), entry["init"]
  if init == FAN_IN_NORMAL:
    if len(shape) < 2:
      raise ValueError(f"state entry {index} ({entry.get('name')}): {FAN_IN_NORMAL} needs a "
                       f"kernel of rank >= 2, not the shape {list(shape)}")
    fan_in = int(np.prod(shape[:-1]))
    values = np.random.RandomState(stream(seed, index)).standard_normal(shape)
    return (values * np.sqrt(2.0 / fan_in)).astype(dtype)
  if init == ONES:
    return np.ones(shape, dtype)
  if init == ZEROS:
    return np.zeros(shape, dtype)
  raise ValueError(f"state entry {index} ({entry.get('name')}): unknown init {init!r}; "
                   f"one of {', '.join(INITS)}")


def initial_state(entries, seed):
  """The initial value of every state entry, in order."""
  return [initial_value(entry, i, seed) for i, entry in enumerate(entries)]


def batch(entries, step, seed):
  """Step `step`'s flat batch: one array per entry ({"shape", "dtype", "fill", "high"})."""
  arrays = []
  for j, entry in enumerate(entries):
    state = np.random.RandomState(stream(seed, step, j))
    shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
    if entry["fill"] == NORMAL:
      arrays.append(state.standard_normal(shape).astype(dtype))
    elif entry["fill"] == LABELS:
      arrays.append(state.randint(0, entry["high"], shape).astype(dtype))
    else:
      raise ValueError(f"batch entry {j}: unknown fill {entry['fill']!r}; use {NORMAL} or {LABELS}")
  return arrays


def checksum(arrays):
  """[sum, sum of absolute values] of each array, in float64: what the runner compares."""
  return [[float(np.sum(a, dtype=np.float64)), float(np.sum(np.abs(a), dtype=np.float64))]
          for a in (np.asarray(x) for x in arrays)]


def mismatches(arrays, expected, names, rtol=1e-6):
  """The names whose checksum differs from expected (regenerated values that are not the host's)."""
  found = []
  for name, got, want in zip(names, checksum(arrays), expected):
    if not np.allclose(got, want, rtol=rtol, atol=1e-6):
      found.append(f"{name} (sum {got[0]:.6g}, expected {want[0]:.6g})")
  return found
