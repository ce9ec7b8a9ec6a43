"""Train, evaluate and export an image classifier with TPUEstimator on CPU, GPU or TPU.

    python train.py --data_dir=DATA --model_dir=MODEL [--use_tpu --tpu=NAME]
    python train.py --data_dir=DATA --model_dir=MODEL --strategy=mirrored  # all GPUs
    python train.py ... --preflight  # on CPU: would this run work on a TPU?

Re-running the same command resumes from the last checkpoint in --model_dir.
"""

import functools
import os

# Before TensorFlow is imported: its C++ start-up chatter is not for the user
# (the lines absl writes before this applies: estimator_tpu.tf_startup, which
# importing estimator_tpu installs; so no TensorFlow import comes before it).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app
from absl import flags

from estimator_tpu import cli
from estimator_tpu import config as config_lib
from estimator_tpu import flags as flags_lib
from estimator_tpu.engines import choose as tpu_estimator
from estimator_tpu.engines import strategies
from estimator_tpu.export import saved_model
from estimator_tpu.run import assemble
from estimator_tpu.run import checkpoints
from estimator_tpu.run import loop
from estimator_tpu.run import preemption
from estimator_tpu.tpu import findings
from estimator_tpu.tpu import preflight

FLAGS = flags.FLAGS
PROGRAM = "train.py"


def define_entry_flags(flag_values=FLAGS):
  """Flags of this entry point that are not Config fields."""
  flags.DEFINE_bool("preflight", False,
                    "Check on CPU what a TPU run with these flags needs, print a "
                    "PASS/WARN/FAIL report and exit (0: pass, 1: fail); trains nothing.",
                    flag_values=flag_values)


def run(flag_values, exit_at_once=False):
  """Runs --mode (or --preflight); returns the process exit status.

  With exit_at_once (the command line), a stop on SIGTERM/SIGINT exits the
  process as soon as what the resume needs is on disk (cli.exit_now).
  """
  checking = "preflight" in flag_values and flag_values["preflight"].value
  try:
    config, saved = flags_lib.config_for_model_dir(flag_values)
    if checking:
      return preflight.preflight(config)
    if strategies.engine_cluster(config.runtime):  # before TensorFlow's first op
      strategies.check_multi_worker_mode(config.runtime)
      strategies.multi_worker_strategy()
    mode = config.runtime.mode
    config, info = assemble.prepare(config, saved, need_train=mode != "eval",
                                    need_eval=mode != "train")
    estimator = assemble.build(config)
  except config_lib.ConfigError as e:
    if checking:
      return findings.report([findings.Finding(findings.FAIL, str(e))])
    return cli.fail(PROGRAM, str(e), cli.EXIT_USAGE)
  strategy = config.runtime.strategy
  loop.say(f"engine: {tpu_estimator.describe_engine(estimator, config.runtime)}")
  loop.say(f"{mode} {config.model.model_fn or config.model.model} on "
           f"{info.num_classes} classes, {info.num_eval_examples} eval images, "
           f"{'' if strategy == 'none' else f'--strategy={strategy}, '}"
           f"model_dir={config.runtime.model_dir}")
  return _run_guarded(config, info, estimator, exit_at_once)


def _run_guarded(config, info, estimator, exit_at_once):
  """Runs the loop and the export; a signal, a full disk or a dead store end it in one line."""
  model_dir, export_dir = config.runtime.model_dir, config.runtime.export_dir
  measure = checkpoints.MeasureHook()
  directory, flag = model_dir, "--model_dir"
  on_stop = _exit_when_saved(model_dir, config.runtime.mode) if exit_at_once else None
  # A worker of a cluster stops only with the others (engines/distribute/workers.py).
  hold = strategies.engine_cluster(config.runtime)
  try:
    with preemption.Watch(on_stop=on_stop, hold=hold) as watch:
      inputs = loop.make_inputs(config, info)
      if config.runtime.mode == "eval":
        loop.continuous_evaluate(estimator, config, inputs, watch=watch)
      else:
        loop.train_and_evaluate(estimator, config, inputs, watch=watch, hooks=[measure],
                                evaluate_each=config.runtime.mode == "train_and_eval")
      if export_dir and not strategies.writes_checkpoints(config.runtime):
        loop.say(f"the chief exports the SavedModel to {export_dir}")
      elif export_dir:
        loop.stop_if_preempted(watch, model_dir)
        directory, flag = export_dir, "--export_dir"
        with watch.interrupting(preemption.EXPORTING):  # staged: nothing half-written stays
          path = saved_model.export_saved_model(estimator, export_dir)
        loop.say(f"exported SavedModel to {path}")
  except preemption.Preempted as e:
    loop.say(_preempted_line(e, config.runtime.mode, model_dir))
    if exit_at_once:
      cli.exit_now(cli.EXIT_RETRY)
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


def _exit_when_saved(model_dir, mode):
  """A preemption.Watch's on_stop: once the step in flight is saved, the line, then exit 75."""

  def on_stop(signal_name, step):
    newest = checkpoints.newest(model_dir)
    saved = checkpoints.restored_step(newest)
    if step is not None and saved != step:
      return  # not saved yet (no checkpoint saver in this process): stop the ordinary way
    loop.say(_preempted_line(preemption.Preempted(signal_name, saved, newest), mode, model_dir))
    cli.exit_now(cli.EXIT_RETRY)

  return on_stop


def _preempted_line(error, mode, model_dir):
  if error.during == preemption.EXPORTING:
    return (f"preempted ({error.signal_name}) while exporting; training is complete in "
            f"{model_dir}: run the same command to export")
  if mode == "eval":
    return (f"preempted ({error.signal_name}) while evaluating; the evaluations so far are "
            "in eval_history.jsonl; run the same command to go on")
  if error.checkpoint is None:
    return f"preempted ({error.signal_name}) before the first checkpoint; run the same command"
  return (f"preempted ({error.signal_name}) at step {error.step}: checkpoint saved to "
          f"{error.checkpoint}; run the same command to resume")


def _newest_checkpoint_bytes(model_dir):
  newest = checkpoints.newest(model_dir)
  return checkpoints.checkpoint_bytes(newest) if newest else None


def _resume_hint(model_dir):
  newest = checkpoints.newest(model_dir)
  if not newest:
    return "; free space, then run the same command"
  return (f"; the newest checkpoint, step {checkpoints.restored_step(newest)}, is intact: "
          "free space, then run the same command to resume from it")


def main():
  """The `train.py` / `estimator-tpu-train` command."""
  cli.quiet_tensorflow()
  flags_lib.define_flags()
  define_entry_flags()
  app.run(cli.make_main(PROGRAM, functools.partial(run, exit_at_once=True), FLAGS))


if __name__ == "__main__":
  main()
