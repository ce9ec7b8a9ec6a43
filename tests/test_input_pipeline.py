"""input_fn: fully static shapes, transpose, exact padded evaluation, labels 0-based."""

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
import numpy as np
import tensorflow as tf

from estimator_tpu import testing
from estimator_tpu.data import input_pipeline


def _first(dataset):
  return next(iter(dataset))


def test_training_batches_are_fully_static(digits_dir):
  input_fn = input_pipeline.make_input_fn(f"{digits_dir}/train-*", True, IMAGE_SIZE, seed=1)
  dataset = input_fn({"batch_size": 4})
  features_spec, labels_spec = dataset.element_spec
  assert features_spec["image"].shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3)
  assert labels_spec.shape == (4,)
  features, labels = _first(dataset)
  assert features["image"].shape == (4, 32, 32, 3)
  assert labels.dtype == tf.int32
  assert np.all((labels.numpy() >= 0) & (labels.numpy() < 10))


def test_transpose_gives_hwcn_and_round_trips(digits_dir):
  plain = input_pipeline.make_input_fn(
      f"{digits_dir}/validation-*", False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=8)({"batch_size": 8})
  transposed = input_pipeline.make_input_fn(
      f"{digits_dir}/validation-*", False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=8, transpose_input=True)({"batch_size": 8})
  assert transposed.element_spec[0]["image"].shape == (IMAGE_SIZE, IMAGE_SIZE, 3, 8)
  images = _first(plain)[0]["image"]
  hwcn = _first(transposed)[0]["image"]
  np.testing.assert_array_equal(input_pipeline.transpose_from_hwcn(hwcn), images)


def test_eval_pads_to_whole_batches_and_counts_every_record_once(digits_dir):
  input_fn = input_pipeline.make_input_fn(
      f"{digits_dir}/validation-*", False, IMAGE_SIZE, num_examples=NUM_EVAL,
      global_batch_size=8)
  batches = list(input_fn({"batch_size": 8}))
  assert len(batches) == input_pipeline.eval_steps(NUM_EVAL, 8) == 5
  weights = np.concatenate([f["weight"].numpy() for f, _ in batches])
  assert weights.shape == (40,)
  assert weights.sum() == NUM_EVAL
  np.testing.assert_array_equal(weights[:NUM_EVAL], 1.0)
  np.testing.assert_array_equal(weights[NUM_EVAL:], 0.0)
  for features, labels in batches:
    assert features["image"].shape == (8, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert labels.shape == (8,)


def test_eval_labels_are_the_written_labels_minus_offset(tmp_path):
  testing.write_digits_dataset(str(tmp_path), num_train=10, num_eval=12)
  from estimator_tpu.data import digits as datasets
  _, expected = datasets.digit_arrays(limit=22)
  input_fn = input_pipeline.make_input_fn(
      f"{tmp_path}/validation-*", False, 32, num_examples=12, global_batch_size=4)
  labels = np.concatenate([batch.numpy() for _, batch in input_fn({"batch_size": 4})])
  np.testing.assert_array_equal(labels, expected[10:])


def test_eval_input_needs_its_size():
  try:
    input_pipeline.make_input_fn("x-*", False, 32)
  except ValueError as e:
    assert "num_examples" in str(e)
  else:
    raise AssertionError("expected ValueError")


def test_context_shards_files_per_host(digits_dir):
  class FakeContext:
    num_hosts = 2
    current_host = 1

  from estimator_tpu.data import schema as features
  records = input_pipeline._read_records(
      f"{digits_dir}/train-*", False, None, FakeContext())
  names = {features.parse_example(r)["filename"].numpy().decode().split("/")[0]
           for r in records}
  # The fixture writes 2 train shards; host 1 of 2 reads only the second.
  assert names == {"train1"}
