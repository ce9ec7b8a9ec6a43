"""Prints docs/MIGRATING.md's tables from the registry: python -m estimator_tpu.compat."""

from estimator_tpu.compat import registry

if __name__ == "__main__":
  print(registry.markdown_tables())
