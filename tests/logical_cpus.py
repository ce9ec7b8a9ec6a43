"""Runs a program in a process with N logical CPU devices.

    python tests/logical_cpus.py N PROGRAM ARGS...

Several logical CPU devices stand in for several GPUs (MirroredStrategy
replicates over them); they must be configured before TensorFlow starts, so
this sets them up and then runs PROGRAM as `__main__` with ARGS as its argv.
"""

import os
import runpy
import sys


def main(argv):
  count, program, args = int(argv[1]), argv[2], argv[3:]
  import tensorflow as tf
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count)
  sys.argv = [program, *args]
  sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
  runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
  main(sys.argv)
