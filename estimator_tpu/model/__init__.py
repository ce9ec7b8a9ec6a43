"""The model: networks, model_fn, metrics, optimization, device augmentation, a user's model_fn."""
