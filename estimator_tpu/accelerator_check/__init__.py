"""A JAX engine's training step checked and timed where only JAX and NumPy are installed."""
