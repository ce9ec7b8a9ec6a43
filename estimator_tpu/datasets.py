"""Moved to estimator_tpu.data.digits; this path (also for `python -m`) goes next release."""

import sys
import warnings

from estimator_tpu import _moved
from estimator_tpu.data import digits
from estimator_tpu.data.digits import digit_arrays  # noqa: F401 -- the old names, still importable
from estimator_tpu.data.digits import digit_class_names  # noqa: F401
from estimator_tpu.data.digits import encode_jpeg  # noqa: F401
from estimator_tpu.data.digits import write_digits  # noqa: F401

warnings.warn(_moved.moved_message("estimator_tpu.datasets", "estimator_tpu.data.digits"),
              FutureWarning, stacklevel=2)

if __name__ == "__main__":
  sys.exit(digits.main())
