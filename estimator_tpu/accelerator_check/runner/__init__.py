"""What an accelerator check bundle carries besides its steps: JAX and NumPy only, no TensorFlow."""
