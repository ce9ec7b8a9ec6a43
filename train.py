"""Train, evaluate and export an image classifier with TPUEstimator on CPU, GPU or TPU.

    python train.py --data_dir=DATA --model_dir=MODEL [--use_tpu --tpu=NAME]
    python train.py --data_dir=DATA --model_dir=MODEL --strategy=mirrored  # all GPUs
    python train.py ... --preflight  # on CPU: would this run work on a TPU?

Re-running the same command resumes from the last checkpoint in --model_dir.
"""

import os

# Before TensorFlow is imported: its C++ start-up chatter is not for the user.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app
from absl import flags
import tensorflow as tf

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu.export import saved_model
from estimator_tpu.tpu import findings
from estimator_tpu.tpu import preflight
from estimator_tpu.training import assemble
from estimator_tpu.training import checkpoints
from estimator_tpu.training import loop
from estimator_tpu.training import preemption

FLAGS = flags.FLAGS
PROGRAM = "train.py"


def define_entry_flags(flag_values=FLAGS):
  """Flags of this entry point that are not Config fields."""
  flags.DEFINE_bool("preflight", False,
                    "Check on CPU what a TPU run with these flags needs, print a "
                    "PASS/WARN/FAIL report and exit (0: pass, 1: fail); trains nothing.",
                    flag_values=flag_values)


def run(flag_values):
  """Runs --mode (or --preflight); returns the process exit status."""
  checking = "preflight" in flag_values and flag_values["preflight"].value
  try:
    config, saved = flags_lib.config_for_model_dir(flag_values)
    if checking:
      return preflight.preflight(config)
    mode = config.runtime.mode
    config, info = assemble.prepare(config, saved, need_train=mode != "eval",
                                    need_eval=mode != "train")
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    if checking:
      return findings.report([findings.Finding(findings.FAIL, str(e))])
    return cli.fail(PROGRAM, str(e), cli.EXIT_USAGE)
  strategy = config.runtime.strategy
  loop.say(f"{mode} {config.model.model_fn or config.model.model} on "
           f"{info.num_classes} classes, {info.num_eval_examples} eval images, "
           f"{'' if strategy == 'none' else f'--strategy={strategy}, '}"
           f"model_dir={config.runtime.model_dir}")
  return _run_guarded(config, info, estimator)


def _run_guarded(config, info, estimator):
  """Runs the loop and the export; a signal, a full disk or a dead store end it in one line."""
  model_dir, export_dir = config.runtime.model_dir, config.runtime.export_dir
  measure = checkpoints.MeasureHook()
  directory, flag = model_dir, "--model_dir"
  try:
    with preemption.Watch() as watch:
      inputs = loop.make_inputs(config, info)
      if config.runtime.mode == "eval":
        loop.continuous_evaluate(estimator, config, inputs, watch=watch)
      else:
        loop.train_and_evaluate(estimator, config, inputs, watch=watch, hooks=[measure],
                                evaluate_each=config.runtime.mode == "train_and_eval")
      if export_dir:
        directory, flag = export_dir, "--export_dir"
        path = saved_model.export_saved_model(estimator, export_dir)
        loop.say(f"exported SavedModel to {path}")
  except preemption.Preempted as e:
    loop.say(_preempted_line(e, config.runtime.mode))
    return cli.EXIT_RETRY
  except config_lib.ConfigError as e:
    return cli.fail(PROGRAM, str(e), cli.EXIT_USAGE)
  except Exception as e:
    needed = measure.bytes or _newest_checkpoint_bytes(model_dir)
    failure = cli.storage_failure(e, directory, flag, needed)
    if failure is None:
      raise
    message, status = failure
    if flag == "--model_dir":
      checkpoints.discard_unfinished(model_dir)
      message += _resume_hint(model_dir)
    return cli.fail(PROGRAM, message, status)
  return 0


def _preempted_line(error, mode):
  if mode == "eval":
    return (f"preempted ({error.signal_name}) while evaluating; the evaluations so far are "
            "in eval_history.jsonl; run the same command to go on")
  if error.checkpoint is None:
    return f"preempted ({error.signal_name}) before the first checkpoint; run the same command"
  return (f"preempted ({error.signal_name}) at step {error.step}: checkpoint saved to "
          f"{error.checkpoint}; run the same command to resume")


def _newest_checkpoint_bytes(model_dir):
  newest = tf.train.latest_checkpoint(model_dir)
  return checkpoints.checkpoint_bytes(newest) if newest else None


def _resume_hint(model_dir):
  newest = tf.train.latest_checkpoint(model_dir)
  if not newest:
    return "; free space, then run the same command"
  return (f"; the newest checkpoint, step {checkpoints.restored_step(newest)}, is intact: "
          "free space, then run the same command to resume from it")


def main():
  """The `train.py` / `estimator-tpu-train` command."""
  cli.quiet_tensorflow()
  flags_lib.define_flags()
  define_entry_flags()
  app.run(cli.make_main(PROGRAM, run, FLAGS))


if __name__ == "__main__":
  main()
