"""Trains, evaluates and exports the legacy digits model, 2018 tutorial style.

  python -m examples.legacy_tpu_model.main --data_dir=DATA --model_dir=MODEL \
      --export_dir=EXPORT --train_steps=300

Without --tpu (and --use_tpu=false) it runs on CPU: the cluster resolver,
RunConfig, TPUConfig and CrossShardOptimizer are the TPU code paths, made
harmless off TPU by estimator_tpu.compat.
"""

import os

from estimator_tpu.compat import tf
from examples.legacy_tpu_model import model

NUM_LABEL_CLASSES = 10


def _current_step(model_dir):
  checkpoint = tf.train.latest_checkpoint(model_dir)
  if not checkpoint:
    return 0
  return int(tf.train.load_variable(checkpoint, tf.GraphKeys.GLOBAL_STEP))


def build_estimator(model_dir, use_tpu=False, tpu=None, train_batch_size=64,
                    eval_batch_size=50, iterations_per_loop=100, num_shards=8,
                    learning_rate=model.DEFAULT_LEARNING_RATE):
  """The TPUEstimator; `tpu=None` off Cloud TPU gives a local resolver."""
  resolver = tf.contrib.cluster_resolver.TPUClusterResolver(tpu)
  config = tf.contrib.tpu.RunConfig(
      cluster=resolver, model_dir=model_dir,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=iterations_per_loop, num_shards=num_shards))
  return tf.contrib.tpu.TPUEstimator(
      model_fn=model.model_fn, use_tpu=use_tpu, config=config,
      train_batch_size=train_batch_size, eval_batch_size=eval_batch_size,
      predict_batch_size=eval_batch_size, export_to_tpu=False,
      params={"num_label_classes": NUM_LABEL_CLASSES,
              "learning_rate": learning_rate, "model_dir": model_dir})


def train_and_evaluate(data_dir, model_dir, train_steps=300,
                       steps_per_eval=300, train_batch_size=64,
                       eval_batch_size=50, num_eval_images=200,
                       export_dir=None, **estimator_kwargs):
  """Alternates train and evaluate until `train_steps`, then exports.

  Args:
    data_dir: directory with train-* and validation-* TFRecords.
    model_dir: checkpoints and summaries.
    train_steps: global step to train to (resumes from a checkpoint).
    steps_per_eval: train steps between evaluations.
    train_batch_size: global training batch size.
    eval_batch_size: global evaluation batch size.
    num_eval_images: validation examples; evaluates the full batches of them.
    export_dir: if set, export a SavedModel under it at the end.
    **estimator_kwargs: for build_estimator (use_tpu, tpu, learning_rate, ...).

  Returns:
    (eval_results dict of the last evaluation, export path bytes or None).
  """
  estimator = build_estimator(model_dir, train_batch_size=train_batch_size,
                              eval_batch_size=eval_batch_size,
                              **estimator_kwargs)
  train_input_fn = model.make_input_fn(
      os.path.join(data_dir, "train-*"), tf.estimator.ModeKeys.TRAIN)
  eval_input_fn = model.make_input_fn(
      os.path.join(data_dir, "validation-*"), tf.estimator.ModeKeys.EVAL)
  eval_steps = num_eval_images // eval_batch_size
  current_step = _current_step(model_dir)
  eval_results = None
  while current_step < train_steps:
    next_checkpoint = min(current_step + steps_per_eval, train_steps)
    estimator.train(input_fn=train_input_fn, max_steps=next_checkpoint)
    current_step = next_checkpoint
    eval_results = estimator.evaluate(input_fn=eval_input_fn, steps=eval_steps)
    tf.logging.info("Eval results at step %d: %s", current_step, eval_results)
  export_path = None
  if export_dir:
    export_path = estimator.export_savedmodel(
        export_dir, model.serving_input_receiver_fn)
  return eval_results, export_path


def define_flags():
  """Defines the flags main() reads (called only when run as a script)."""
  flags = tf.app.flags
  flags.DEFINE_string("data_dir", None, "Directory of train-*/validation-*.")
  flags.DEFINE_string("model_dir", None, "Checkpoints and summaries.")
  flags.DEFINE_string("export_dir", None, "Where to export a SavedModel.")
  flags.DEFINE_string("tpu", None, "Cloud TPU name or grpc:// address.")
  flags.DEFINE_bool("use_tpu", False, "Run on TPU (needs --tpu).")
  flags.DEFINE_integer("train_steps", 300, "Global step to train to.")
  flags.DEFINE_integer("steps_per_eval", 300, "Train steps between evals.")
  flags.DEFINE_integer("train_batch_size", 64, "Global training batch.")
  flags.DEFINE_integer("eval_batch_size", 50, "Global evaluation batch.")
  flags.DEFINE_integer("num_eval_images", 200, "Validation examples.")
  flags.DEFINE_integer("iterations_per_loop", 100, "Steps per TPU loop.")
  flags.DEFINE_float("learning_rate", model.DEFAULT_LEARNING_RATE,
                     "Momentum SGD learning rate.")
  flags.mark_flags_as_required(["data_dir", "model_dir"])


def main(unused_argv):
  flags = tf.app.flags.FLAGS
  tf.logging.set_verbosity(tf.logging.INFO)
  train_and_evaluate(
      flags.data_dir, flags.model_dir, train_steps=flags.train_steps,
      steps_per_eval=flags.steps_per_eval,
      num_eval_images=flags.num_eval_images, export_dir=flags.export_dir,
      use_tpu=flags.use_tpu, tpu=flags.tpu,
      train_batch_size=flags.train_batch_size,
      eval_batch_size=flags.eval_batch_size,
      iterations_per_loop=flags.iterations_per_loop,
      learning_rate=flags.learning_rate)


if __name__ == "__main__":
  define_flags()
  tf.app.run(main)
