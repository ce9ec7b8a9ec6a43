"""The tf.distribute engine: the TPUEstimator contract in tf.functions under a strategy."""
