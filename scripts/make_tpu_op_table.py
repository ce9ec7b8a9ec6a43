"""Writes estimator_tpu/tpu/tpu_ops.txt: the ops the TPU build of TensorFlow compiles for a TPU.

The table is read from the TPU build of TensorFlow (`tensorflow-tpu`, the tpu stack): every op
with a kernel registered for the XLA_TPU_JIT device, the TPU compiler's op set. Run it there,
never with TPU_SKIP_MDS_QUERY unset (libtpu would ask the cloud metadata server):

    TPU_SKIP_MDS_QUERY=1 PYTHONPATH=$PWD .venv-tpu/bin/python scripts/make_tpu_op_table.py

It needs no TPU: the registrations are TensorFlow's own, made when it is imported. Preflight
checks every op of a model's step against the table, so its verdict does not move with what
the installed TensorFlow's XLA for the CPU happens to compile.
"""

import importlib
import os
import sys

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "estimator_tpu", "tpu", "tpu_ops.txt")
DEVICE = "XLA_TPU_JIT"


def tpu_op_names():
  """Sorted names of the ops with an XLA_TPU_JIT kernel in this TensorFlow."""
  from tensorflow.python.framework import kernels
  return sorted({k.op for k in kernels.get_all_registered_kernels().kernel
                 if k.device_type == DEVICE})


def main():
  if not os.environ.get("TPU_SKIP_MDS_QUERY"):
    sys.exit("set TPU_SKIP_MDS_QUERY=1 first: the TPU build's libtpu otherwise asks the cloud "
             "metadata server (169.254.169.254) for a TPU")
  # First: off a TPU VM, estimator_tpu keeps libtpu from loading when TensorFlow is imported.
  importlib.import_module("estimator_tpu")
  import tensorflow as tf
  names = tpu_op_names()
  if not names:
    sys.exit(f"TensorFlow {tf.__version__} registers no {DEVICE} kernels: run this with the "
             "TPU build (the tpu stack, .venv-tpu)")
  with open(OUT, "w") as f:
    f.write(f"# TensorFlow ops a TPU compiles: the ops with an {DEVICE} kernel in the\n"
            f"# TPU build {tf.__version__} of TensorFlow (tensorflow-tpu). Made by\n"
            f"# scripts/make_tpu_op_table.py; regenerate there, do not edit. One op a line.\n")
    f.write("\n".join(names) + "\n")
  print(f"{OUT}: {len(names)} ops from TensorFlow {tf.__version__}")


if __name__ == "__main__":
  main()
