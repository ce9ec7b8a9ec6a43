"""`python -m serving.predict`: batch predictions with no server (estimator_tpu.serving.predict)."""

import sys

from estimator_tpu.serving.predict import *  # noqa: F403 -- the same names, for old imports
from estimator_tpu.serving.predict import main

if __name__ == "__main__":
  sys.exit(main())
