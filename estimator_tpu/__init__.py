"""TPUEstimator image classification that runs unchanged on CPU, GPU and TPU."""

__version__ = "0.1.0"
