"""What runs a model_fn: TPUEstimator, the Estimator under a strategy, the tf.distribute engine."""
