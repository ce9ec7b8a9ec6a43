"""JAX's compilation cache for the in-process runs of one test: a program compiled once."""

import contextlib


@contextlib.contextmanager
def compiled_once(directory):
  """JAX's persistent compilation cache in `directory` while the block runs, then as before.

  The JAX engine compiles its step afresh in every run (about 5.5 of a 3-step flowers run's 14 CPU
  seconds here). Inside the block a run whose program is the very one an earlier run of the
  block compiled (the same HLO: the cache is keyed by it) loads that executable instead; a
  program that differs in anything is compiled as before. Outside the block, and for the
  rest of the process, JAX compiles as it did.

  Args:
    directory: a new directory of the test's own (tmp_path / ...).
  """
  import jax
  from jax._src import compilation_cache

  settings = {"jax_compilation_cache_dir": str(directory),
              "jax_persistent_cache_min_compile_time_secs": 0,
              "jax_persistent_cache_min_entry_size_bytes": 0}
  before = {name: getattr(jax.config, name) for name in settings}
  for name, value in settings.items():
    jax.config.update(name, value)
  compilation_cache.reset_cache()  # it reads the directory once, at its first use
  try:
    yield
  finally:
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
