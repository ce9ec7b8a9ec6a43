"""TF 1 optimizers under a tf.distribute strategy: gradients combined across replicas exactly once.

Under TPUEstimator, `CrossShardOptimizer` scales the loss by 1/shards (its
default MEAN reduction) and sums the gradients with CrossReplicaSum; the
optimizer it wraps then applies them once per core. Under a strategy, a TF 1
optimizer's `apply_gradients` already sums the replicas' gradients itself
(`merge_call`, then the strategy's all-reduce), so CrossShardOptimizer's sum
would be a second one (and off TPU an op with no kernel).

`applied(strategy)`, around a model_fn call of the distribute engine, makes
both kinds of optimizer give the mean of the replicas' gradients, once:

- a plain TF 1 optimizer: the loss is scaled by 1/replicas as the Estimator
  does under a strategy (the strategy's `_scale_loss_for_estimator_enabled`),
  and the strategy sums;
- a CrossShardOptimizer (and subclasses that defer to it, as
  estimator_tpu.compat's does inside a TPU computation): it hands
  compute_gradients and apply_gradients to the optimizer it wraps, so the
  same scaling and the strategy's one sum apply;
  with reduction=SUM the loss is not scaled (the sum over replicas).
"""

import contextlib
import threading

import tensorflow as tf
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.ops.losses import losses_impl
from tensorflow.python.tpu import tpu_optimizer

_CrossShard = tpu_optimizer.CrossShardOptimizer


def _compute_gradients(self, loss, var_list=None, **kwargs):
  if (self._reduction == losses_impl.Reduction.SUM and  # pylint: disable=protected-access
      distribute_utils.get_loss_reduction() == tf.distribute.ReduceOp.MEAN):
    # The wrapped optimizer divides by the replicas; a SUM over shards must not.
    loss = loss * float(tf.distribute.get_strategy().num_replicas_in_sync)
  return self._opt.compute_gradients(loss, var_list=var_list, **kwargs)  # pylint: disable=protected-access


def _apply_gradients(self, grads_and_vars, global_step=None, name=None):
  return self._opt.apply_gradients(grads_and_vars, global_step, name)  # pylint: disable=protected-access


_ORIGINALS = {name: _CrossShard.__dict__[name] for name in ("compute_gradients", "apply_gradients")}
_lock = threading.Lock()
_depth = [0]


@contextlib.contextmanager
def applied(strategy):
  """Within: TF 1 optimizers average the replicas' gradients once under strategy.

  A MirroredStrategy's replicas trace in threads that enter and leave in any
  order: CrossShardOptimizer's methods are replaced when the first enters and
  put back when the last leaves.
  """
  with _lock:
    _depth[0] += 1
    if _depth[0] == 1:
      _CrossShard.compute_gradients = _compute_gradients
      _CrossShard.apply_gradients = _apply_gradients
  try:
    scaling = getattr(strategy, "_scale_loss_for_estimator_enabled", None)
    with scaling() if scaling else contextlib.nullcontext():
      yield
  finally:
    with _lock:
      _depth[0] -= 1
      if _depth[0] == 0:
        for name, method in _ORIGINALS.items():
          setattr(_CrossShard, name, method)
