"""The run around an engine: assembly, the loop, checkpoints, preemption, curves, determinism."""
