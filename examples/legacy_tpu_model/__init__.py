"""A 2018-style Cloud TPU model that runs on TF 2.15 via estimator_tpu.compat."""
