"""Checkpoint -> SavedModel for serving: the serving contract and the exporter."""
