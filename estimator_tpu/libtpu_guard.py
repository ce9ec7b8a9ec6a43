"""Keeps TensorFlow's TPU build off the cloud metadata server on a host with no TPU attached.

The tpu stack's `tensorflow-tpu` loads libtpu when `import tensorflow` runs,
and libtpu asks the Compute Engine metadata server (169.254.169.254) for the
TPU's accelerator type and topology. Off a TPU VM that request goes off the
host, or, with no route, is retried for minutes: the import hangs. Two
variables, read when TensorFlow loads, turn this off:

    TPU_SKIP_MDS_QUERY=1   libtpu takes its topology from TPU_* variables and asks no server
    TPU_LOAD_LIBRARY=0     TensorFlow does not load libtpu at all ("not loading libtpu. This
                           is expected if TPU is not used"): no TPU_SYSTEM device appears on a
                           host that has no TPU, and nothing of libtpu runs

`apply()`, called by `import estimator_tpu` before anything imports
TensorFlow, sets both where no TPU is attached, each only if the environment
does not set it already (an explicit `TPU_LOAD_LIBRARY=1` is kept). A
program that imports TensorFlow before estimator_tpu is covered by the tpu
stack's venv: `make install STACK=tpu` writes a start-up file
(`write_startup_file()`) that runs `apply()` when its Python starts. Where a
TPU is attached it changes nothing: libtpu then needs the metadata server to
find its topology. Subprocesses inherit the variables. On the other stacks
nothing reads them.

A TPU is attached when the host has a TPU device file: `/dev/accel*` (TPU v2
to v4, and v5e/v6e VMs that expose the chips so), or a `/dev/vfio/<group>`
whose IOMMU group holds a Google PCI device (vendor 0x1ae0; v5e, v5p, v6e).
"""

import glob
import os
import sysconfig

SKIP_MDS_QUERY = "TPU_SKIP_MDS_QUERY"
LOAD_LIBRARY = "TPU_LOAD_LIBRARY"
GOOGLE_PCI_VENDOR = "0x1ae0"
VARIABLES = (SKIP_MDS_QUERY, LOAD_LIBRARY)
TPU_BUILD = "tensorflow-tpu"


def tpu_devices(dev_root="/dev", sys_root="/sys"):
  """The TPU device files on this host (sorted paths; empty where none is attached)."""
  found = glob.glob(os.path.join(dev_root, "accel*"))
  for group in glob.glob(os.path.join(dev_root, "vfio", "*")):
    name = os.path.basename(group)
    if not name.isdigit():
      continue  # /dev/vfio/vfio, the container file, is there with any VFIO device.
    vendors = glob.glob(os.path.join(sys_root, "kernel", "iommu_groups", name, "devices", "*",
                                     "vendor"))
    if any(_read(path) == GOOGLE_PCI_VENDOR for path in vendors):
      found.append(group)
  return sorted(found)


def _read(path):
  try:
    with open(path) as f:
      return f.read().strip().lower()
  except OSError:
    return ""


def apply(environ=None, dev_root="/dev", sys_root="/sys"):
  """Where no TPU is attached, sets the two variables the environment lacks; returns those set.

  Args:
    environ: the environment to change (os.environ by default).
    dev_root, sys_root: where to look for TPU devices (tests point them elsewhere).

  Returns:
    {name: value} of the variables this call set (empty where a TPU is attached).
  """
  environ = os.environ if environ is None else environ
  if tpu_devices(dev_root, sys_root):
    return {}
  added = {}
  for name, value in ((SKIP_MDS_QUERY, "1"), (LOAD_LIBRARY, "0")):
    if name not in environ:
      environ[name] = added[name] = value
  return added


def is_tpu_build():
  """True where the installed TensorFlow is its TPU build (the tpu stack)."""
  import importlib.metadata  # here: apply() also runs at interpreter start-up (see below)
  try:
    importlib.metadata.version(TPU_BUILD)
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


def runs_without_tpu():
  """True where this process runs the TPU build with libtpu left unloaded (apply() or the user).

  TensorFlow then looks for a TPU platform the first time it lists devices
  and retries for 4 seconds, logging each try (estimator_tpu.tf_startup does
  that listing while it keeps TensorFlow's start-up lines off stderr).
  """
  return os.environ.get(LOAD_LIBRARY) == "0" and is_tpu_build()


STARTUP_FILE = "estimator_tpu_libtpu_guard.pth"


def write_startup_file(site_dir=None):
  """Writes site_dir/estimator_tpu_libtpu_guard.pth, which runs apply() as that Python starts.

  Python runs a .pth file's `import` lines at start-up (the `site` module);
  this one loads this file by its path, not the package, so start-up imports
  nothing else of estimator_tpu. Returns the file's path.
  """
  site_dir = site_dir or sysconfig.get_paths()["purelib"]
  here = os.path.abspath(__file__)
  line = ("import importlib.util as u; "
          f"s = u.spec_from_file_location('estimator_tpu_libtpu_guard', {here!r}); "
          "m = u.module_from_spec(s); s.loader.exec_module(m); m.apply()\n")
  path = os.path.join(site_dir, STARTUP_FILE)
  with open(path, "w") as f:
    f.write(line)
  return path
