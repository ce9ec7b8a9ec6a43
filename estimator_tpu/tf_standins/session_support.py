"""Stand-in for `tensorflow.python.tpu.session_support`: TPU worker health, which TF 2.16 removed.

TPUEstimator builds these on a TPU train graph only: a GracefulShutdownHook with
a finalizer (TF_TPU_GRACEFUL_SHUTDOWN_MODE, 'reset_computation' by default),
and a worker watchdog when TF_TPU_WATCHDOG_TIMEOUT > 0. Both watch the TPU
workers through heartbeat ops whose Python half is gone from current TensorFlow.

- A mode the user asked for (TF_TPU_GRACEFUL_SHUTDOWN_MODE set) or the watchdog
  raises UnavailableOnThisStack when the graph is built, naming the stack that
  has it.
- The default mode builds a hook that does no heartbeat work and says so once,
  at the start of the session, so TPU runs still build and train. Preemption
  by SIGTERM, which is what a Cloud TPU VM sends, never depended on it.
"""

import logging
import os

import tensorflow as tf

from estimator_tpu.tf_standins._refusal import UnavailableOnThisStack

MODE_VARIABLE = "TF_TPU_GRACEFUL_SHUTDOWN_MODE"
FEATURE = "TPU worker-heartbeat graceful shutdown"

log = logging.getLogger("estimator_tpu")


class _Finalizer:
  """An on-shutdown action of the removed module; only its name is kept."""

  def __call__(self, run_context, all_workers, lame_workers):
    raise UnavailableOnThisStack(f"{FEATURE} ({type(self).__name__})")


class ResetComputation(_Finalizer):
  """Reset the TPU computation when a worker fails (the TF default)."""


class ShutdownLameWorkers(_Finalizer):
  """Shut down the workers that stopped answering."""


class ShutdownAllWorkers(_Finalizer):
  """Shut down every worker."""


class GracefulShutdownHook(tf.compat.v1.train.SessionRunHook):
  """Accepted in the default mode (no heartbeats watched, said once); refused when asked for."""

  def __init__(self, checkpoint_prefix, saver=None, on_shutdown_hooks=None):
    if os.environ.get(MODE_VARIABLE):
      raise UnavailableOnThisStack(f"{FEATURE} ({MODE_VARIABLE}={os.environ[MODE_VARIABLE]})")
    self.checkpoint_prefix = checkpoint_prefix
    self.saver = saver
    self.on_shutdown_hooks = list(on_shutdown_hooks or [])

  def begin(self):
    log.warning("%s is not available on TensorFlow %s: TPU worker failures are not "
                "watched in this run (set %s='' to silence this line, or use the "
                "tf2.15 stack)", FEATURE, tf.__version__, MODE_VARIABLE)


def start_worker_watchdog(session, devices=None, ping_interval=60, shutdown_timeout=3600):
  """The TF_TPU_WATCHDOG_TIMEOUT watchdog: refused on this stack."""
  del session, devices, ping_interval, shutdown_timeout
  raise UnavailableOnThisStack("the TPU worker watchdog (TF_TPU_WATCHDOG_TIMEOUT)")
