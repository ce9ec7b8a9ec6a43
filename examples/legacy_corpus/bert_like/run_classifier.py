"""Fine-tunes the small BERT-style encoder on a generated two-class task with TPUEstimator.

  python run_classifier.py --bert_config_file=CONFIG.json --output_dir=OUT \
      --init_checkpoint=PRETRAINED/model.ckpt --do_train --do_eval --do_predict

The task: sequences of random tokens in which a marker token says the class
(token 3: class 1, token 4: class 0). Generated with numpy; nothing downloaded.
"""

import os

import modeling
import numpy as np
import optimization

from estimator_tpu.compat import tf

flags = tf.flags
FLAGS = flags.FLAGS

flags.DEFINE_string("bert_config_file", None, "The config json file of the encoder.")
flags.DEFINE_string("output_dir", None, "Where checkpoints and results are written.")
flags.DEFINE_string("init_checkpoint", None, "A pre-trained checkpoint to start from.")
flags.DEFINE_integer("max_seq_length", 16, "Tokens per sequence.")
flags.DEFINE_bool("do_train", False, "Whether to run training.")
flags.DEFINE_bool("do_eval", False, "Whether to run eval on the dev set.")
flags.DEFINE_bool("do_predict", False, "Whether to run prediction on the test set.")
flags.DEFINE_integer("train_batch_size", 8, "Total batch size for training.")
flags.DEFINE_integer("eval_batch_size", 8, "Total batch size for eval.")
flags.DEFINE_integer("predict_batch_size", 8, "Total batch size for predict.")
flags.DEFINE_float("learning_rate", 1e-3, "The initial learning rate for Adam.")
flags.DEFINE_integer("num_train_examples", 64, "Generated training examples.")
flags.DEFINE_integer("num_eval_examples", 16, "Generated dev (and test) examples.")
flags.DEFINE_float("num_train_epochs", 1.0, "Epochs of training.")
flags.DEFINE_float("warmup_proportion", 0.25, "Proportion of training for LR warm-up.")
flags.DEFINE_integer("save_checkpoints_steps", 4, "How often to save a checkpoint.")
flags.DEFINE_integer("iterations_per_loop", 4, "Steps per estimator call.")
flags.DEFINE_bool("use_tpu", False, "Whether to use TPU or GPU/CPU.")
flags.DEFINE_string("tpu_name", None, "The Cloud TPU to use for training.")
flags.DEFINE_integer("num_tpu_cores", 8, "TPU cores (only with use_tpu).")

NUM_LABELS = 2


def generate_examples(count, seq_length, vocab_size, seed):
  """(input_ids, input_mask, segment_ids, label_ids) as numpy arrays."""
  rng = np.random.RandomState(seed)
  input_ids = rng.randint(5, vocab_size, size=(count, seq_length)).astype(np.int32)
  label_ids = rng.randint(0, NUM_LABELS, size=count).astype(np.int32)
  positions = rng.randint(1, seq_length, size=count)
  input_ids[np.arange(count), positions] = np.where(label_ids == 1, 3, 4)
  input_ids[:, 0] = 2  # [CLS]
  input_mask = np.ones_like(input_ids)
  segment_ids = np.zeros_like(input_ids)
  return input_ids, input_mask, segment_ids, label_ids


def input_fn_builder(arrays, seq_length, is_training, drop_remainder):
  """An in-memory input_fn over generated arrays."""
  input_ids, input_mask, segment_ids, label_ids = arrays

  def input_fn(params):
    batch_size = params["batch_size"]
    d = tf.data.Dataset.from_tensor_slices({
        "input_ids": tf.constant(input_ids, shape=[len(input_ids), seq_length]),
        "input_mask": tf.constant(input_mask, shape=[len(input_ids), seq_length]),
        "segment_ids": tf.constant(segment_ids, shape=[len(input_ids), seq_length]),
        "label_ids": tf.constant(label_ids, shape=[len(input_ids)]),
    })
    if is_training:
      d = d.repeat()
      d = d.shuffle(buffer_size=100, seed=1)
    return d.batch(batch_size=batch_size, drop_remainder=drop_remainder)

  return input_fn


def create_model(bert_config, is_training, input_ids, input_mask, segment_ids, labels,
                 num_labels):
  """A classification head on the pooled output."""
  model = modeling.BertModel(config=bert_config, is_training=is_training,
                             input_ids=input_ids, input_mask=input_mask,
                             token_type_ids=segment_ids)
  output_layer = model.get_pooled_output()
  hidden_size = output_layer.shape[-1].value
  output_weights = tf.get_variable(
      "output_weights", [num_labels, hidden_size],
      initializer=tf.truncated_normal_initializer(stddev=0.02))
  output_bias = tf.get_variable("output_bias", [num_labels], initializer=tf.zeros_initializer())
  with tf.variable_scope("loss"):
    if is_training:
      output_layer = tf.nn.dropout(output_layer, keep_prob=0.9)
    logits = tf.nn.bias_add(tf.matmul(output_layer, output_weights, transpose_b=True),
                            output_bias)
    probabilities = tf.nn.softmax(logits, axis=-1)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot_labels = tf.one_hot(labels, depth=num_labels, dtype=tf.float32)
    per_example_loss = -tf.reduce_sum(one_hot_labels * log_probs, axis=-1)
    loss = tf.reduce_mean(per_example_loss)
    return loss, per_example_loss, logits, probabilities


def model_fn_builder(bert_config, num_labels, init_checkpoint, learning_rate, num_train_steps,
                     num_warmup_steps, use_tpu):
  """The model_fn closure TPUEstimator calls."""

  def model_fn(features, labels, mode, params):
    tf.logging.info("*** Features ***")
    for name in sorted(features.keys()):
      tf.logging.info("  name = %s, shape = %s", name, features[name].shape)
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    total_loss, per_example_loss, logits, probabilities = create_model(
        bert_config, is_training, features["input_ids"], features["input_mask"],
        features["segment_ids"], features["label_ids"], num_labels)

    tvars = tf.trainable_variables()
    initialized_variable_names = {}
    scaffold_fn = None
    if init_checkpoint:
      assignment_map, initialized_variable_names = (
          modeling.get_assignment_map_from_checkpoint(tvars, init_checkpoint))

      def tpu_scaffold():
        tf.train.init_from_checkpoint(init_checkpoint, assignment_map)
        return tf.train.Scaffold()

      scaffold_fn = tpu_scaffold
    tf.logging.info("**** Trainable Variables ****")
    for var in tvars:
      init_string = ", *INIT_FROM_CKPT*" if var.name in initialized_variable_names else ""
      tf.logging.info("  name = %s, shape = %s%s", var.name, var.shape, init_string)

    if mode == tf.estimator.ModeKeys.TRAIN:
      train_op = optimization.create_optimizer(
          total_loss, learning_rate, num_train_steps, num_warmup_steps, use_tpu)
      return tf.contrib.tpu.TPUEstimatorSpec(
          mode=mode, loss=total_loss, train_op=train_op, scaffold_fn=scaffold_fn)
    if mode == tf.estimator.ModeKeys.EVAL:

      def metric_fn(per_example_loss, label_ids, logits):
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"eval_accuracy": tf.metrics.accuracy(labels=label_ids, predictions=predictions),
                "eval_loss": tf.metrics.mean(values=per_example_loss)}

      return tf.contrib.tpu.TPUEstimatorSpec(
          mode=mode, loss=total_loss, scaffold_fn=scaffold_fn,
          eval_metrics=(metric_fn, [per_example_loss, features["label_ids"], logits]))
    return tf.contrib.tpu.TPUEstimatorSpec(
        mode=mode, predictions={"probabilities": probabilities}, scaffold_fn=scaffold_fn)

  return model_fn


def main(_):
  tf.logging.set_verbosity(tf.logging.INFO)
  if not FLAGS.do_train and not FLAGS.do_eval and not FLAGS.do_predict:
    raise ValueError("At least one of `do_train`, `do_eval` or `do_predict' must be True.")
  bert_config = modeling.BertConfig.from_json_file(FLAGS.bert_config_file)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError("Cannot use sequence length %d because the BERT model was only trained "
                     "up to sequence length %d" %
                     (FLAGS.max_seq_length, bert_config.max_position_embeddings))
  tf.gfile.MakeDirs(FLAGS.output_dir)

  tpu_cluster_resolver = None
  if FLAGS.use_tpu and FLAGS.tpu_name:
    tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(FLAGS.tpu_name)
  run_config = tf.contrib.tpu.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.output_dir,
      save_checkpoints_steps=FLAGS.save_checkpoints_steps,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop, num_shards=FLAGS.num_tpu_cores,
          per_host_input_for_training=tf.contrib.tpu.InputPipelineConfig.PER_HOST_V2))

  train_arrays = generate_examples(FLAGS.num_train_examples, FLAGS.max_seq_length,
                                   bert_config.vocab_size, seed=1)
  num_train_steps = int(FLAGS.num_train_examples / FLAGS.train_batch_size *
                        FLAGS.num_train_epochs)
  num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
  model_fn = model_fn_builder(
      bert_config=bert_config, num_labels=NUM_LABELS, init_checkpoint=FLAGS.init_checkpoint,
      learning_rate=FLAGS.learning_rate, num_train_steps=num_train_steps,
      num_warmup_steps=num_warmup_steps, use_tpu=FLAGS.use_tpu)
  estimator = tf.contrib.tpu.TPUEstimator(
      use_tpu=FLAGS.use_tpu, model_fn=model_fn, config=run_config,
      train_batch_size=FLAGS.train_batch_size, eval_batch_size=FLAGS.eval_batch_size,
      predict_batch_size=FLAGS.predict_batch_size)

  if FLAGS.do_train:
    tf.logging.info("***** Running training *****")
    tf.logging.info("  Num steps = %d", num_train_steps)
    estimator.train(input_fn=input_fn_builder(train_arrays, FLAGS.max_seq_length, True, True),
                    max_steps=num_train_steps)

  eval_arrays = generate_examples(FLAGS.num_eval_examples, FLAGS.max_seq_length,
                                  bert_config.vocab_size, seed=2)
  if FLAGS.do_eval:
    eval_steps = FLAGS.num_eval_examples // FLAGS.eval_batch_size
    result = estimator.evaluate(
        input_fn=input_fn_builder(eval_arrays, FLAGS.max_seq_length, False, True),
        steps=eval_steps)
    output_eval_file = os.path.join(FLAGS.output_dir, "eval_results.txt")
    with tf.gfile.GFile(output_eval_file, "w") as writer:
      tf.logging.info("***** Eval results *****")
      for key in sorted(result.keys()):
        tf.logging.info("  %s = %s", key, str(result[key]))
        writer.write("%s = %s\n" % (key, str(result[key])))

  if FLAGS.do_predict:
    result = estimator.predict(
        input_fn=input_fn_builder(eval_arrays, FLAGS.max_seq_length, False, False))
    output_predict_file = os.path.join(FLAGS.output_dir, "test_results.tsv")
    with tf.gfile.GFile(output_predict_file, "w") as writer:
      for prediction in result:
        writer.write("\t".join(str(p) for p in prediction["probabilities"]) + "\n")


if __name__ == "__main__":
  flags.mark_flag_as_required("bert_config_file")
  flags.mark_flag_as_required("output_dir")
  tf.app.run()
