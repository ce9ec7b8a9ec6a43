"""`python -m serving.client`: TF Serving's REST/gRPC client (estimator_tpu.serving.client)."""

import sys

from estimator_tpu.serving.client import *  # noqa: F403 -- the same names, for old imports
from estimator_tpu.serving.client import main

if __name__ == "__main__":
  sys.exit(main())
