"""Our input_fns on a simulated pod: N hosts x M cores, each host called as PER_HOST_V2 calls it."""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import testing
from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.tpu import pods

CORES_PER_HOST = 2
PER_CORE_BATCH = 4
SIZE = 8
# Records per file: uneven, one empty, one of a single record.
UNEVEN = (1, 120, 0, 37, 142)


def _write(directory, sizes):
  """TFRecord files of tiny JPEGs whose label is the record's own index (unique)."""
  os.makedirs(directory, exist_ok=True)
  jpeg = tf.io.encode_jpeg(tf.zeros([SIZE, SIZE, 3], tf.uint8)).numpy()
  start = 0
  for index, count in enumerate(sizes):
    testing.write_records(
        os.path.join(directory, f"part-{index:05d}.tfrecord"),
        (schema.make_example(jpeg, label, "c", SIZE, SIZE, f"{label}.jpg")
         for label in range(start, start + count)))
    start += count
  return os.path.join(directory, "part-*"), start


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
  return _write(str(tmp_path_factory.mktemp("uneven")), UNEVEN)


@pytest.fixture(scope="module")
def three_files(tmp_path_factory):
  return _write(str(tmp_path_factory.mktemp("three")), (9, 30, 4))


PARAMS = {"image_size": SIZE, "transpose_input": False}


@pytest.mark.parametrize("hosts", [1, 2, 3, 4, 8])
def test_eval_counts_every_record_exactly_once_on_any_number_of_hosts(uneven, hosts):
  pattern, total = uneven
  global_batch = hosts * CORES_PER_HOST * PER_CORE_BATCH
  input_fn = input_pipeline.make_input_fn(pattern, False, num_examples=total,
                                          global_batch_size=global_batch)
  steps = input_pipeline.eval_steps(total, global_batch)
  feeds = pods.feed_hosts(input_fn, PARAMS, hosts, CORES_PER_HOST, PER_CORE_BATCH, steps,
                          check_end=True)
  # Every host yields exactly the batches TPUEstimator pulls: no fewer, no more.
  assert [(f.batches, f.more_after) for f in feeds] == [(steps * CORES_PER_HOST, False)] * hosts
  np.testing.assert_array_equal(pods.counted_labels(feeds), np.arange(total))
  weights = np.concatenate([w for f in feeds for w in f.weights])
  assert set(np.unique(weights)) <= {0.0, 1.0} and weights.sum() == total


@functools.cache  # tests asking for the same feed share it
def _host_label_sets(pattern, total, hosts, seed=None):
  input_fn = input_pipeline.make_input_fn(pattern, True, random_flip=False, seed=seed)
  # Enough steps to pass every host's share twice.
  share = -(-total // hosts) if hosts > 1 else total
  steps = 2 * -(-max(share, max(UNEVEN)) // (CORES_PER_HOST * PER_CORE_BATCH))
  feeds = pods.feed_hosts(input_fn, PARAMS, hosts, CORES_PER_HOST, PER_CORE_BATCH, steps)
  assert not any(f.ran_dry for f in feeds), [(f.host, f.batches) for f in feeds]
  return [set(np.concatenate(f.labels).tolist()) for f in feeds]


@pytest.mark.parametrize("hosts", [1, 2, 3, pytest.param(4, marks=pytest.mark.slow),
                                   pytest.param(8, marks=pytest.mark.slow)])
def test_training_feeds_every_host_and_no_record_twice(uneven, three_files, hosts):
  for pattern, total in (uneven, three_files):  # 5 and 3 files: fewer than 8 hosts either way
    seen = _host_label_sets(pattern, total, hosts)
    assert all(seen), f"a host got no records: {[len(s) for s in seen]}"
    assert sum(len(s) for s in seen) == len(set().union(*seen))  # disjoint
    assert set().union(*seen) == set(range(total))


def test_training_host_shares_do_not_depend_on_the_seed(uneven):
  pattern, total = uneven
  assert _host_label_sets(pattern, total, 2, seed=None) == _host_label_sets(
      pattern, total, 2, seed=7)


def test_host_params_carry_a_real_tpu_context():
  params = pods.host_params({"image_size": SIZE}, 4, 8, 3, PER_CORE_BATCH)
  context = params["context"]
  assert type(context).__name__ == "TPUContext"
  assert (context.num_hosts, context.current_host, context.num_of_replicas_per_host) == (4, 3, 8)
  assert params["batch_size"] == PER_CORE_BATCH
  assert input_pipeline.host_of(context) == (4, 3) and input_pipeline.host_of(None) == (1, 0)


def _config(total, hosts):
  from estimator_tpu import config as config_lib
  batch = hosts * CORES_PER_HOST * PER_CORE_BATCH
  return (config_lib.Config()
          .replace("data", image_size=SIZE, num_eval_examples=total)
          .replace("train", train_batch_size=batch, eval_batch_size=batch)
          .replace("runtime", num_cores=hosts * CORES_PER_HOST, cores_per_host=CORES_PER_HOST))


def test_pod_findings_pass_for_our_input_fns(uneven):
  pattern, total = uneven
  config = _config(total, 4)
  train_fn = input_pipeline.make_input_fn(pattern, True, random_flip=False)
  eval_fn = input_pipeline.make_input_fn(pattern, False, num_examples=total,
                                         global_batch_size=config.train.eval_batch_size)
  found = pods.pod_findings(config, train_fn, eval_fn, pattern, PARAMS)
  assert [f.status for f in found] == ["PASS", "PASS"], found
  assert "files per host: 1, 1, 1, 1" in found[0].message  # 4 non-empty files, 4 hosts


def test_pod_findings_fail_for_an_input_fn_that_ignores_the_host(uneven):
  pattern, total = uneven
  config = _config(total, 2)
  exact = input_pipeline.make_input_fn(pattern, False, num_examples=total,
                                       global_batch_size=config.train.eval_batch_size)

  def every_host_reads_everything(params):  # pads each host to the global total
    return exact(dict(params, context=None))

  # 19 steps x 2 cores x 4 on each of 2 hosts = 304 weight-1 examples: some records twice.
  (_, eval_finding) = pods.pod_findings(config, exact, every_host_reads_everything, pattern,
                                        PARAMS)
  assert eval_finding.status == "FAIL"
  assert eval_finding.message.startswith(
      f"eval input on 2 hosts: 304 of {total} records counted; host 0 fed 38+ of the "
      "38 batches TPUEstimator pulls in 19 steps")
