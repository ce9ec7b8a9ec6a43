"""Masked-LM and sentence-order pretraining of a tiny ALBERT-style encoder, in the 2022-23 form.

  python run_pretraining.py --output_dir=OUT --do_train --do_eval --num_train_steps=8

Google's TPU programs took this form before the estimator left TensorFlow:
`import tensorflow.compat.v1 as tf` and `from tensorflow.compat.v1 import
estimator as tf_estimator`, with `tf_estimator.tpu.*` for the TPU estimator.
Examples are generated (random token ids with a fixed seed).
"""

import os

from absl import app
from absl import flags
import numpy as np
from estimator_tpu.compat import tf
from tensorflow.compat.v1 import estimator as tf_estimator

FLAGS = flags.FLAGS

flags.DEFINE_string("output_dir", None, "The output directory where checkpoints are written.")
flags.DEFINE_bool("do_train", False, "Whether to run training.")
flags.DEFINE_bool("do_eval", False, "Whether to run eval on the dev set.")
flags.DEFINE_integer("train_batch_size", 16, "Total batch size for training.")
flags.DEFINE_integer("eval_batch_size", 16, "Total batch size for eval.")
flags.DEFINE_integer("num_train_steps", 8, "Number of training steps.")
flags.DEFINE_integer("max_eval_steps", 2, "Maximum number of eval steps.")
flags.DEFINE_integer("save_checkpoints_steps", 4, "How often to save the model checkpoint.")
flags.DEFINE_integer("iterations_per_loop", 4, "How many steps to make in each estimator call.")
flags.DEFINE_float("learning_rate", 1e-3, "The initial learning rate for LAMB-free Adam.")
flags.DEFINE_bool("use_tpu", False, "Whether to use TPU or GPU/CPU.")
flags.DEFINE_string("tpu_name", None, "The Cloud TPU to use for training.")
flags.DEFINE_integer("num_tpu_cores", 8, "Only used if `use_tpu` is True.")

VOCAB_SIZE = 40
SEQ_LENGTH = 12
MAX_PREDICTIONS = 3
EMBEDDING_SIZE = 8
HIDDEN_SIZE = 16


def make_examples(count, seed):
  rng = np.random.RandomState(seed)
  input_ids = rng.randint(4, VOCAB_SIZE, size=(count, SEQ_LENGTH)).astype(np.int32)
  positions = np.stack([rng.choice(SEQ_LENGTH, MAX_PREDICTIONS, replace=False)
                        for _ in range(count)]).astype(np.int32)
  masked_ids = np.take_along_axis(input_ids, positions, axis=1)
  masked_input = input_ids.copy()
  np.put_along_axis(masked_input, positions, 3, axis=1)  # [MASK]
  order_labels = rng.randint(0, 2, size=(count,)).astype(np.int32)
  return {"input_ids": masked_input, "masked_lm_positions": positions,
          "masked_lm_ids": masked_ids, "masked_lm_weights": np.ones_like(masked_ids, np.float32),
          "next_sentence_labels": order_labels}


def input_fn_builder(is_training, count, seed):
  """Creates an `input_fn` closure to be passed to TPUEstimator."""
  examples = make_examples(count, seed)

  def input_fn(params):
    batch_size = params["batch_size"]
    d = tf.data.Dataset.from_tensor_slices(examples)
    if is_training:
      d = d.repeat().shuffle(buffer_size=100, seed=seed)
    else:
      d = d.repeat()
    return d.batch(batch_size, drop_remainder=True)

  return input_fn


def gather_indexes(sequence_tensor, positions):
  """Gathers the vectors at the specific positions over a minibatch."""
  batch_size, seq_length, width = sequence_tensor.shape.as_list()
  flat_offsets = tf.reshape(tf.range(0, batch_size, dtype=tf.int32) * seq_length, [-1, 1])
  flat_positions = tf.reshape(positions + flat_offsets, [-1])
  flat_sequence_tensor = tf.reshape(sequence_tensor, [batch_size * seq_length, width])
  return tf.gather(flat_sequence_tensor, flat_positions)


def model_fn_builder(learning_rate, use_tpu):
  """Returns `model_fn` closure for TPUEstimator."""

  def model_fn(features, labels, mode, params):
    del labels, params
    is_training = mode == tf_estimator.ModeKeys.TRAIN
    with tf.variable_scope("bert"):
      embedding_table = tf.get_variable(
          "word_embeddings", [VOCAB_SIZE, EMBEDDING_SIZE],
          initializer=tf.truncated_normal_initializer(stddev=0.02))
      embedded = tf.nn.embedding_lookup(embedding_table, features["input_ids"])
      sequence_output = tf.layers.dense(embedded, HIDDEN_SIZE, activation=tf.tanh,
                                        name="encoder")
      if is_training:
        sequence_output = tf.nn.dropout(sequence_output, rate=0.1)
      pooled_output = tf.layers.dense(sequence_output[:, 0], HIDDEN_SIZE, activation=tf.tanh,
                                      name="pooler")
    with tf.variable_scope("cls/predictions"):
      masked = gather_indexes(sequence_output, features["masked_lm_positions"])
      masked = tf.layers.dense(masked, EMBEDDING_SIZE, name="transform")
      mlm_logits = tf.matmul(masked, embedding_table, transpose_b=True)
      mlm_log_probs = tf.nn.log_softmax(mlm_logits, axis=-1)
      mlm_ids = tf.reshape(features["masked_lm_ids"], [-1])
      mlm_weights = tf.reshape(features["masked_lm_weights"], [-1])
      per_example_mlm = -tf.reduce_sum(
          mlm_log_probs * tf.one_hot(mlm_ids, depth=VOCAB_SIZE, dtype=tf.float32), axis=[-1])
      mlm_loss = tf.reduce_sum(mlm_weights * per_example_mlm) / (tf.reduce_sum(mlm_weights)
                                                                 + 1e-5)
    with tf.variable_scope("cls/seq_relationship"):
      sop_logits = tf.layers.dense(pooled_output, 2, name="output")
      sop_log_probs = tf.nn.log_softmax(sop_logits, axis=-1)
      sop_labels = tf.reshape(features["next_sentence_labels"], [-1])
      sop_loss = tf.reduce_mean(-tf.reduce_sum(tf.one_hot(sop_labels, depth=2) * sop_log_probs,
                                               axis=-1))
    total_loss = mlm_loss + sop_loss

    if mode == tf_estimator.ModeKeys.TRAIN:
      optimizer = tf.train.AdamOptimizer(learning_rate)
      if use_tpu:
        optimizer = tf.tpu.CrossShardOptimizer(optimizer)
      train_op = optimizer.minimize(total_loss, global_step=tf.train.get_or_create_global_step())
      return tf_estimator.tpu.TPUEstimatorSpec(mode=mode, loss=total_loss, train_op=train_op)

    def metric_fn(mlm_log_probs, mlm_ids, mlm_weights, per_example_mlm, sop_log_probs,
                  sop_labels):
      """Computes the loss and accuracy of the model."""
      mlm_predictions = tf.argmax(mlm_log_probs, axis=-1, output_type=tf.int32)
      sop_predictions = tf.argmax(sop_log_probs, axis=-1, output_type=tf.int32)
      return {
          "masked_lm_accuracy": tf.metrics.accuracy(mlm_ids, mlm_predictions,
                                                    weights=mlm_weights),
          "masked_lm_loss": tf.metrics.mean(per_example_mlm, weights=mlm_weights),
          "sentence_order_accuracy": tf.metrics.accuracy(sop_labels, sop_predictions),
      }

    eval_metrics = (metric_fn, [mlm_log_probs, mlm_ids, mlm_weights, per_example_mlm,
                                sop_log_probs, sop_labels])
    return tf_estimator.tpu.TPUEstimatorSpec(mode=mode, loss=total_loss,
                                             eval_metrics=eval_metrics)

  return model_fn


def main(_):
  tf.logging.set_verbosity(tf.logging.INFO)
  if not FLAGS.do_train and not FLAGS.do_eval:
    raise ValueError("At least one of `do_train` or `do_eval` must be True.")
  tf.gfile.MakeDirs(FLAGS.output_dir)

  tpu_cluster_resolver = None
  if FLAGS.use_tpu and FLAGS.tpu_name:
    tpu_cluster_resolver = tf.distribute.cluster_resolver.TPUClusterResolver(FLAGS.tpu_name)
  is_per_host = tf_estimator.tpu.InputPipelineConfig.PER_HOST_V2
  run_config = tf_estimator.tpu.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.output_dir,
      save_checkpoints_steps=FLAGS.save_checkpoints_steps,
      tpu_config=tf_estimator.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop, num_shards=FLAGS.num_tpu_cores,
          per_host_input_for_training=is_per_host))
  estimator = tf_estimator.tpu.TPUEstimator(
      use_tpu=FLAGS.use_tpu, model_fn=model_fn_builder(FLAGS.learning_rate, FLAGS.use_tpu),
      config=run_config, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size)

  if FLAGS.do_train:
    estimator.train(input_fn=input_fn_builder(True, 256, seed=1),
                    max_steps=FLAGS.num_train_steps)
  if FLAGS.do_eval:
    result = estimator.evaluate(input_fn=input_fn_builder(False, 64, seed=2),
                                steps=FLAGS.max_eval_steps)
    output_eval_file = os.path.join(FLAGS.output_dir, "eval_results.txt")
    with tf.gfile.GFile(output_eval_file, "w") as writer:
      tf.logging.info("***** Eval results *****")
      for key in sorted(result.keys()):
        tf.logging.info("  %s = %s", key, str(result[key]))
        writer.write("%s = %s\n" % (key, str(result[key])))


if __name__ == "__main__":
  flags.mark_flag_as_required("output_dir")
  app.run(main)
