"""input_fn: fully static shapes, transpose, exact padded evaluation, labels 0-based."""

from conftest import IMAGE_SIZE
from conftest import NUM_EVAL
import numpy as np
import pytest
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


# --- photo-like records whose colour names their label ------------------------------------------

LOW, HIGH = 60, 190


def _class_colour(label):
  """Class k's RGB: bit c of k sets channel c high."""
  return [HIGH if label >> c & 1 else LOW for c in range(3)]


def _colour_records(path, count=96, png_every=4):
  """count 64x48 images of 8 classes, every png_every-th one a PNG; returns the labels."""
  import io

  from PIL import Image

  from estimator_tpu.data import schema
  examples, labels = [], []
  for i in range(count):
    label = (i * 5) % 8
    array = np.zeros((48, 64, 3), np.uint8) + np.array(_class_colour(label), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG" if i % png_every == 0 else "JPEG")
    examples.append(schema.make_example(buffer.getvalue(), label, str(label), 48, 64, f"{i}"))
    labels.append(label)
  testing.write_records(str(path), examples)
  return np.array(labels)


def _decoded_classes(images):
  from estimator_tpu.data import image_ops
  pixels = images * np.array(image_ops.STDDEV_RGB) + np.array(image_ops.MEAN_RGB)
  means = pixels.mean(axis=(1, 2))  # [batch, 3]
  # Brightness moves a channel at most 32 levels: LOW stays under the midpoint, HIGH over it.
  high = means > (LOW + HIGH) / 2
  return (high * np.array([1, 2, 4])).sum(axis=1)


def test_training_images_keep_their_labels_and_each_epoch_covers_every_record(tmp_path):
  labels = _colour_records(tmp_path / "train-00000-of-00001")
  for cache, deterministic in ((False, False), (True, False), (False, True)):
    input_fn = input_pipeline.make_input_fn(str(tmp_path / "train-*"), True, 24,
                                            cache=cache, seed=3, deterministic=deterministic)
    batches = list(input_fn({"batch_size": 16}).take(30))  # 5 epochs of 96
    images = np.concatenate([f["image"].numpy() for f, _ in batches])
    seen = np.concatenate([b.numpy() for _, b in batches])
    assert images.shape == (480, 24, 24, 3) and images.dtype == np.float32
    # Uniform colours: crops, flips and contrast keep the class pattern, so every
    # image (JPEG or PNG) must still carry its own record's label.
    np.testing.assert_array_equal(_decoded_classes(images), seen)
    # Shuffled, yet each record about once per epoch (parallel maps may move a
    # few across an epoch boundary).
    assert not np.array_equal(seen[:96], labels)
    counts = np.bincount(seen, minlength=8)
    np.testing.assert_allclose(counts, 5 * np.bincount(labels, minlength=8), atol=4)


def test_eval_batches_are_preprocess_for_eval_of_each_record_in_order(tmp_path):
  from estimator_tpu.data import image_ops
  from estimator_tpu.data import schema
  labels = _colour_records(tmp_path / "validation-00000-of-00001", count=20)
  input_fn = input_pipeline.make_input_fn(str(tmp_path / "validation-*"), False, 24,
                                          num_examples=20, global_batch_size=8, cache=True)
  batches = list(input_fn({"batch_size": 8}))
  images = np.concatenate([f["image"].numpy() for f, _ in batches])[:20]
  np.testing.assert_array_equal(np.concatenate([b.numpy() for _, b in batches])[:20], labels)
  records = tf.data.TFRecordDataset(str(tmp_path / "validation-00000-of-00001"))
  expected = np.stack([image_ops.preprocess_for_eval(
      schema.parse_example(r)["image_bytes"], 24).numpy() for r in records])
  # The evaluation input and serving share preprocess_for_eval: the same pixels.
  np.testing.assert_allclose(images, expected, atol=1e-5)


def _batches(input_fn, count):
  """count batches of input_fn as {name: array} (images, augmentation draws, labels)."""
  batches = []
  for features, labels in input_fn({"batch_size": 8}).take(count):
    batches.append(dict({k: v.numpy() for k, v in features.items()}, labels=labels.numpy()))
  return batches


@pytest.mark.parametrize("cache,on_device", [(False, False), (True, False), (False, True)])
def test_deterministic_input_gives_the_same_batches_for_the_same_seed(digits_dir, cache,
                                                                      on_device):
  def batches(seed):
    return _batches(input_pipeline.make_input_fn(
        f"{digits_dir}/train-*", True, IMAGE_SIZE, cache=cache, seed=seed,
        augment_on_device=on_device, deterministic=True), 30)  # 240 > the 200 records

  first, second, other = batches(7), batches(7), batches(8)
  assert sorted(first[0]) == (["augmentation", "image", "labels"] if on_device
                              else ["image", "labels"])
  for a, b in zip(first, second):
    for name in a:
      np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert not np.array_equal(first[0]["image"], other[0]["image"])  # the seed matters


def test_deterministic_input_needs_a_seed(digits_dir):
  with pytest.raises(ValueError, match="deterministic training input_fn needs a seed"):
    input_pipeline.make_input_fn(f"{digits_dir}/train-*", True, IMAGE_SIZE, deterministic=True)
