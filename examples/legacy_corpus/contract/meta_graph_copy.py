"""Checkpoints in the estimator's full form: `.meta` beside each, graph.pbtxt, copied and imported.

  python meta_graph_copy.py --model_dir=MODEL --results=RESULTS.json

Trains with a checkpoint every 2 steps and keep_checkpoint_max=2, evaluates,
then does what ALBERT's run_pretraining.py does with its best checkpoint: copies
`model.ckpt-N.{meta,data-00000-of-00001,index}` to `model.ckpt-best.*`
(tf.gfile.Copy). It then imports the copied MetaGraphDef into a fresh graph
(tf.train.import_meta_graph), restores the copy with the Saver it brings, and
runs the imported graph's logits on a batch fed in place of its input. Writes
model_dir's files, the imported graph's variables and collections, their
restored values and the logits to --results as JSON. With --nosave_graph_def
(RunConfig's checkpoint_save_graph_def=False) it writes model_dir's files only.
"""

import json
import os
import re

import numpy as np

from estimator_tpu.compat import tf

tf.flags.DEFINE_string("model_dir", None, "Estimator model_dir.")
tf.flags.DEFINE_string("results", None, "Where to write what the program saw (JSON).")
tf.flags.DEFINE_bool("save_graph_def", True, "RunConfig's checkpoint_save_graph_def.")
FLAGS = tf.flags.FLAGS


def model_fn(features, labels, mode, params):
  del params
  hidden = tf.layers.dense(features, 8, activation=tf.nn.relu, name="hidden",
                           kernel_initializer=tf.constant_initializer(0.05))
  logits = tf.layers.dense(hidden, 3, name="logits",
                           kernel_initializer=tf.constant_initializer(-0.02))
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    optimizer = tf.train.MomentumOptimizer(0.1, momentum=0.9)
    train_op = optimizer.minimize(loss, tf.train.get_global_step())
    return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  def metric_fn(labels, logits):
    return {"accuracy": tf.metrics.accuracy(labels, tf.argmax(logits, axis=1))}

  return tf.contrib.tpu.TPUEstimatorSpec(mode, loss=loss,
                                         eval_metrics=(metric_fn, [labels, logits]))


def examples():
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
  return x, y


def input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(examples()).repeat()
  return dataset.batch(params["batch_size"], drop_remainder=True)


def files(model_dir):
  """model_dir's files, event files by kind (their names hold the time and host)."""
  return sorted(re.sub(r"^events\.out\.tfevents\..*", "events.out.tfevents", name)
                for name in tf.gfile.ListDirectory(model_dir))


def import_and_restore(prefix):
  """The copied checkpoint's own graph, imported and restored in a fresh session."""
  with tf.Graph().as_default() as graph:
    saver = tf.train.import_meta_graph(prefix + ".meta")
    with tf.Session() as session:
      saver.restore(session, prefix)
      variables = {v.op.name: v for v in tf.global_variables()}
      values = session.run(variables)
      logits = session.run(graph.get_tensor_by_name("logits/BiasAdd:0"),
                           {graph.get_tensor_by_name("IteratorGetNext:0"): examples()[0][:8]})
  return {
      "variables": sorted(variables),
      "trainable": sorted(v.op.name for v in graph.get_collection("trainable_variables")),
      "collections": sorted(graph.get_all_collection_keys()),
      "values": {name: np.asarray(value).tolist() for name, value in values.items()},
      "logits": logits.tolist(),
  }


def main(_):
  estimator = tf.contrib.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=8, eval_batch_size=8,
      config=tf.contrib.tpu.RunConfig(model_dir=FLAGS.model_dir, save_checkpoints_steps=2,
                                      keep_checkpoint_max=2,
                                      checkpoint_save_graph_def=FLAGS.save_graph_def))
  estimator.train(input_fn, max_steps=6)
  result = estimator.evaluate(input_fn, steps=2)
  if not FLAGS.save_graph_def:
    with open(FLAGS.results, "w") as f:
      json.dump({"files": files(FLAGS.model_dir)}, f, indent=1)
    return
  checkpoint_path = estimator.latest_checkpoint()
  for ext in ["meta", "data-00000-of-00001", "index"]:
    src_ckpt = checkpoint_path + ".{}".format(ext)
    tgt_ckpt = checkpoint_path.rsplit("-", 1)[0] + "-best.{}".format(ext)
    tf.gfile.Copy(src_ckpt, tgt_ckpt, overwrite=True)
  best = os.path.join(FLAGS.model_dir, "model.ckpt-best")
  results = {
      "files": files(FLAGS.model_dir),
      "checkpoint": os.path.basename(checkpoint_path),
      "graph_pbtxt_nodes": len(tf.gfile.GFile(os.path.join(FLAGS.model_dir, "graph.pbtxt"))
                               .read().split("\nnode {")) - 1,
      "imported": import_and_restore(best),
      "eval": {key: float(value) for key, value in result.items()},
  }
  with open(FLAGS.results, "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  tf.app.run()
