"""A model_fn's training step as one JAX function of explicit state, to export or check against TF.

The JAX engine's training step for one replica -- TensorFlow's lowering of
the model_fn's forward pass, gradients and optimizer update -- as
`fn(state, batch) -> (state, loss)`: `jax.export` serializes it for machines
that have JAX and no TensorFlow (benchmarks/accelerator_check/), and the
same step run by TensorFlow itself (`tf_step`) gives the reference losses.
"""

import jax
import numpy as np
import tensorflow as tf

from estimator_tpu.engines.distribute import engine as distribute_engine

ModeKeys = distribute_engine.ModeKeys


class PortableTrainStep:
  """One replica's training step of a JaxEngine for the batches of input_fn.

  Args:
    engine: a jax engine.JaxEngine (one replica).
    input_fn: its training input_fn; its batches' static shapes are the step's.

  Attributes:
    state_names: the variables' names, in the order fn takes and returns them.
    state_avals: a jax.ShapeDtypeStruct of each (64-bit values in 32 bits).
    batch_avals: one of each flat batch tensor.
  """

  def __init__(self, engine, input_fn):
    if engine.num_replicas != 1:
      raise ValueError(f"a portable step is one replica's; the engine has {engine.num_replicas}")
    self._engine = engine
    with engine.strategy.scope():
      self._iterator = iter(engine._dataset(input_fn, ModeKeys.TRAIN))  # pylint: disable=protected-access
      self._step = engine._train_function()  # pylint: disable=protected-access
      spec = self._iterator.element_spec
      self._flat_specs = [tf.TensorSpec(s.shape, s.dtype) for s in tf.nest.flatten(spec)]
      self._mesh_step, layout = self._step._program(spec, tuple(self._flat_specs))  # pylint: disable=protected-access
      # TensorFlow's own run of the step draws random numbers as the lowered one does.
      self._reference = tf.function(self._step._replica_fn(spec, layout), autograph=False)  # pylint: disable=protected-access
    flat = tf.nest.flatten(layout.structured)
    self._loss_index = next(i for i, t in enumerate(flat) if t is layout.structured["loss"])
    self._num_results = len(flat)
    self.state_names = list(self._mesh_step.state_names)
    variables = engine._store.variables  # pylint: disable=protected-access
    self.state_avals = [_aval(variables[n].shape, variables[n].dtype) for n in self.state_names]
    self.batch_avals = [_aval(s.shape, s.dtype) for s in self._flat_specs]

  def fn(self, state, batch):
    """(new state, loss): one training step, a pure JAX function of state and the flat batch."""
    values, results = self._mesh_step.step(dict(zip(self.state_names, state)), list(batch))
    return tuple(values[n] for n in self.state_names), results[self._loss_index]

  def next_batch(self):
    """The input_fn's next batch, as flat NumPy arrays."""
    with self._engine.strategy.scope():
      return [t.numpy() for t in tf.nest.flatten(self._iterator.get_next())]

  def tf_state(self):
    """The TensorFlow variables' values, in state_names' order."""
    variables = self._engine._store.variables  # pylint: disable=protected-access
    return [variables[n].numpy() for n in self.state_names]

  def set_tf_state(self, values):
    """Sets the TensorFlow variables (state_names' order) to values."""
    variables = self._engine._store.variables  # pylint: disable=protected-access
    for name, value in zip(self.state_names, values):
      variables[name].assign(np.asarray(value).astype(variables[name].dtype.as_numpy_dtype))

  def tf_step(self, batch):
    """One training step run by TensorFlow itself on its variables; returns the loss."""
    with self._engine.strategy.scope():
      outputs = self._reference(tf.constant(0), *[tf.constant(x) for x in batch])
    return float(outputs[self._loss_index])


def _aval(shape, dtype):
  return jax.ShapeDtypeStruct(tuple(tf.TensorShape(shape).as_list()),
                              jax.dtypes.canonicalize_dtype(tf.as_dtype(dtype).as_numpy_dtype))
