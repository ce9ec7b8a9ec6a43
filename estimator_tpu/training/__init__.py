"""Training: networks, model_fn, metrics, optimization, the estimators, the loop, curves."""
