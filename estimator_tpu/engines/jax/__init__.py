"""--engine=jax: the TPUEstimator contract with each step lowered by TensorFlow and run by JAX."""
