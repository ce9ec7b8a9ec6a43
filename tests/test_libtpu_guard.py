"""No metadata server query by libtpu where no TPU is attached; a run with no network shows it."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from estimator_tpu import libtpu_guard
from estimator_tpu import stacks
from tests.conftest import program_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _touch(path, text=""):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _iommu_device(sys_root, group, vendor):
  _touch(os.path.join(sys_root, "kernel", "iommu_groups", str(group), "devices",
                      f"0000:00:0{group}.0", "vendor"), vendor + "\n")


def test_no_device_files_means_no_tpu(tmp_path):
  dev, sys_root = tmp_path / "dev", tmp_path / "sys"
  _touch(str(dev / "null"))
  _touch(str(dev / "vfio" / "vfio"))  # the VFIO container file, there with any VFIO device
  _iommu_device(str(sys_root), 3, "0x10de")
  _touch(str(dev / "vfio" / "3"))  # a GPU's group
  assert libtpu_guard.tpu_devices(str(dev), str(sys_root)) == []


def test_accel_and_google_vfio_groups_are_tpus(tmp_path):
  dev, sys_root = tmp_path / "dev", tmp_path / "sys"
  _touch(str(dev / "accel0"))
  _touch(str(dev / "vfio" / "7"))
  _iommu_device(str(sys_root), 7, "0x1AE0")
  assert libtpu_guard.tpu_devices(str(dev), str(sys_root)) == [str(dev / "accel0"),
                                                                 str(dev / "vfio" / "7")]


def test_apply_sets_only_what_the_environment_lacks(tmp_path):
  no_tpu = dict(dev_root=str(tmp_path / "dev"), sys_root=str(tmp_path / "sys"))
  environ = {}
  assert libtpu_guard.apply(environ, **no_tpu) == {"TPU_SKIP_MDS_QUERY": "1",
                                                   "TPU_LOAD_LIBRARY": "0"}
  assert environ == {"TPU_SKIP_MDS_QUERY": "1", "TPU_LOAD_LIBRARY": "0"}
  users = {"TPU_SKIP_MDS_QUERY": "0", "TPU_LOAD_LIBRARY": "1"}
  assert libtpu_guard.apply(users, **no_tpu) == {}
  assert users == {"TPU_SKIP_MDS_QUERY": "0", "TPU_LOAD_LIBRARY": "1"}


def test_apply_changes_nothing_where_a_tpu_is_attached(tmp_path):
  _touch(str(tmp_path / "dev" / "accel0"))
  environ = {}
  assert libtpu_guard.apply(environ, str(tmp_path / "dev"), str(tmp_path / "sys")) == {}
  assert environ == {}


def test_this_process_runs_with_the_switches_on_this_host():
  assert libtpu_guard.tpu_devices() == []  # tests run on hosts without a TPU
  assert os.environ["TPU_SKIP_MDS_QUERY"] == "1" and os.environ["TPU_LOAD_LIBRARY"] == "0"
  assert libtpu_guard.is_tpu_build() == (stacks.NAME == "tpu")


# Run in a network namespace that has only loopback: the metadata server is
# unreachable, so a libtpu that asked it would retry for minutes (measured:
# still waiting after 150 s) and the run would hit the timeout below.
_PROGRAM = """
import sys
import estimator_tpu
import tensorflow as tf
kinds = sorted({{d.device_type for d in tf.config.list_physical_devices()}})
print("devices:", ",".join(kinds), flush=True)
from absl import flags
from estimator_tpu import flags as flags_lib
from estimator_tpu.cli import train
flag_values = flags.FlagValues()
flags_lib.define_flags(flag_values)
flag_values(["train.py", "--data_dir={data}", "--model_dir={model}", "--model=tiny",
             "--image_size=32", "--train_steps=4", "--steps_per_eval=4", "--train_batch_size=8",
             "--eval_batch_size=8", "--norandom_flip", "--seed=1"])
sys.exit(train.run(flag_values))
"""
# What libtpu or TensorFlow's TPU code prints: libtpu's lines, the platform retries, TPU_* hints.
_TPU_LINE = re.compile(r"libtpu|TPU platform|TPU metadata|instance metadata|TPU_[A-Z]")


def _no_network():
  """The argv prefix that runs a command in a new network namespace with loopback up, or None."""
  unshare, ip = shutil.which("unshare"), shutil.which("ip") or "/usr/sbin/ip"
  if unshare is None or not os.path.exists(ip):
    return None
  prefix = [unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]
  probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
  return prefix if probe.returncode == 0 else None


NO_NETWORK = _no_network()


@pytest.mark.skipif(NO_NETWORK is None, reason="needs `unshare -n` (root or user namespaces) and "
                    "`ip` to make a network namespace")
def test_import_and_training_with_no_network_finish_quietly(tmp_path, digits_dir):
  env = program_env()
  for name in ("TPU_SKIP_MDS_QUERY", "TPU_LOAD_LIBRARY", "TF_CPP_MIN_LOG_LEVEL"):
    env.pop(name, None)  # set by this process's import; the program must set them itself
  env["PYTHONPATH"] = REPO
  program = _PROGRAM.format(data=digits_dir, model=tmp_path / "model")
  done = subprocess.run([*NO_NETWORK, sys.executable, "-c", program], cwd=REPO, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
  out = done.stdout
  assert done.returncode == 0, out[-3000:]
  # `import tensorflow` (the TPU build's libtpu load and platform retries), at TensorFlow's most
  # talkative log level, printed nothing; the TPU build found no TPU device.
  assert out.startswith("devices: CPU\n"), out[:3000]
  assert not _TPU_LINE.search(out), out[:3000]
  assert re.search(r"^\[estimator_tpu\] step 4/4 \| .*loss=\d+\.\d{4}", out, re.MULTILINE), out


def test_the_tpu_venv_sets_the_switches_as_python_starts():
  show = ("import os; "
          "print(os.environ.get('TPU_SKIP_MDS_QUERY'), os.environ.get('TPU_LOAD_LIBRARY'))")
  done = subprocess.run([sys.executable, "-c", show], env={"PATH": "/usr/bin"},
                        capture_output=True, text=True, timeout=60, check=True)
  assert done.stdout.split() == (["1", "0"] if stacks.NAME == "tpu" else ["None", "None"])


@pytest.mark.skipif(NO_NETWORK is None, reason="needs `unshare -n` (root or user namespaces) and "
                    "`ip` to make a network namespace")
def test_tensorflow_imported_first_with_no_network_finishes(tmp_path):
  program = ("import tensorflow as tf\n"
             "print('devices:', ','.join(sorted({d.device_type "
             "for d in tf.config.list_physical_devices()})))\n")
  done = subprocess.run([*NO_NETWORK, sys.executable, "-c", program], cwd=str(tmp_path),
                        env={"PATH": "/usr/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
  assert done.returncode == 0, done.stdout[-3000:]
  assert done.stdout.splitlines()[-1] == "devices: CPU", done.stdout[-3000:]
  assert "metadata" not in done.stdout
