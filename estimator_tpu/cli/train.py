"""Train, evaluate and export an image classifier with TPUEstimator on CPU, GPU or TPU.

The `train.py` / `estimator-tpu-train` command:

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
from estimator_tpu.cli import parsing

# TensorFlow loads with these, after the flags are parsed (--help answers at once).
tpu_estimator = cli.lazy_import("estimator_tpu.engines.choose")
strategies = cli.lazy_import("estimator_tpu.engines.strategies")
saved_model = cli.lazy_import("estimator_tpu.export.saved_model")
versions = cli.lazy_import("estimator_tpu.export.versions")
assemble = cli.lazy_import("estimator_tpu.run.assemble")
checkpoints = cli.lazy_import("estimator_tpu.run.checkpoints")
loop = cli.lazy_import("estimator_tpu.run.loop")
preemption = cli.lazy_import("estimator_tpu.run.preemption")
findings = cli.lazy_import("estimator_tpu.tpu.findings")
preflight = cli.lazy_import("estimator_tpu.tpu.preflight")

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
        _export(assemble.build(assemble.export_config(config)), export_dir, watch)
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
  _say_where_the_curves_are(model_dir)
  return 0


def _say_where_the_curves_are(model_dir):
  """The run's last line: its learning curves, and TensorBoard's command for the rest."""
  curves = os.path.join(model_dir, "learning_curves.png")
  if os.path.exists(curves) or "://" in curves:
    loop.say(f"learning curves: {curves}; all the summaries: tensorboard --logdir={model_dir}")
  else:
    loop.say(f"summaries: tensorboard --logdir={model_dir}")


def _export(estimator, export_dir, watch):
  """Publishes the newest checkpoint's SavedModel, unless a version of export_dir holds it.

  estimator: the run's exporter (assemble.export_config: CPU/GPU, float32).
  """
  found = saved_model.find_export(estimator, export_dir)
  if found:
    loop.say(f"{checkpoints.newest(estimator.model_dir)} is already exported to {export_dir} as "
             f"{versions.served_line(export_dir, found)}; no new version published")
    return
  with watch.interrupting(preemption.EXPORTING):  # staged: nothing half-written stays
    path = saved_model.export_saved_model(estimator, export_dir)
  loop.say(f"exported SavedModel to {path}")


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


def _stopped(signal_name):
  """What a signal did, as the user knows it: Ctrl-C interrupts, a SIGTERM preempts."""
  return "interrupted (Ctrl-C)" if signal_name == "SIGINT" else f"preempted ({signal_name})"


def _preempted_line(error, mode, model_dir):
  stopped = _stopped(error.signal_name)
  if error.during == preemption.EXPORTING:
    return (f"{stopped} while exporting; training is complete in "
            f"{model_dir}: run the same command to export")
  if mode == "eval":
    return (f"{stopped} while evaluating; the evaluations so far are "
            "in eval_history.jsonl; run the same command to go on")
  if error.checkpoint is None:
    return f"{stopped} before the first checkpoint; run the same command"
  return (f"{stopped} at step {error.step}: checkpoint saved to "
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
  global PROGRAM
  PROGRAM = program = cli.program_name(PROGRAM)
  flags_lib.define_flags()
  define_entry_flags()
  groups = [*flags_lib.help_groups(), ("Checks", ["preflight"])]
  app.run(cli.make_main(program, functools.partial(run, exit_at_once=True), FLAGS),
          flags_parser=parsing.flags_parser(program, __doc__, groups))


if __name__ == "__main__":
  main()
