"""A TPU pod's input, simulated on CPU: input_fn called once per host, as PER_HOST_V2 calls it.

On a pod slice TPUEstimator calls the input_fn once on each host, with
params['batch_size'] = the per-core batch and params['context'] = a
TPUContext naming the host; every step it pulls one batch per core of that
host (num_of_replicas_per_host). feed_hosts() does the same with TPUEstimator's
own TPUContext, over a stand-in for the TPU system it would have queried, and
records what each host fed: whether it ran dry, and the labels and weights
of every batch.
"""

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator.tpu import tpu_context

from estimator_tpu.data import input_pipeline
from estimator_tpu.data import schema
from estimator_tpu.tpu.findings import FAIL
from estimator_tpu.tpu.findings import PASS
from estimator_tpu.tpu.findings import Finding

# Cores per TPU host: 8 on v2/v3/v5e hosts; set cores_per_host for others (v4: 4).
DEFAULT_CORES_PER_HOST = 8


class _PodSystem:
  """What TPUContext reads from TPUEstimator's internal context, for a pod of this shape."""

  def __init__(self, num_hosts, cores_per_host):
    self.num_hosts = num_hosts
    self.num_of_cores_per_host = cores_per_host
    self.num_of_replicas_per_host = cores_per_host
    self.num_replicas = self.num_cores = num_hosts * cores_per_host
    self.model_parallelism_enabled = False


def host_params(params, num_hosts, cores_per_host, host, per_core_batch):
  """The params a PER_HOST_V2 input_fn gets on `host`: per-core batch, a real TPUContext."""
  context = tpu_context.TPUContext(internal_ctx=_PodSystem(num_hosts, cores_per_host),
                                   host_id=host)
  return dict(params, batch_size=per_core_batch, context=context)


@dataclasses.dataclass
class HostFeed:
  """What one host fed: `batches` pulled of `wanted`, and whether its input had more."""
  host: int
  wanted: int
  labels: list
  weights: list
  more_after: bool

  @property
  def batches(self):
    return len(self.labels)

  @property
  def ran_dry(self):
    return self.batches < self.wanted


def feed_hosts(input_fn, params, num_hosts, cores_per_host, per_core_batch, steps,
               check_end=False):
  """Pulls `steps` steps of batches from every host's input_fn, as TPUEstimator does.

  Args:
    input_fn: a TPUEstimator input_fn(params).
    params: the run's params (without batch_size and context).
    num_hosts, cores_per_host: the pod's shape.
    per_core_batch: params['batch_size'] on a core.
    steps: steps to feed; each takes cores_per_host batches from every host.
    check_end: also try one batch more, to tell whether the input ends exactly.

  Returns:
    [HostFeed], one per host. Labels are int arrays [per_core_batch]; weights
    are the `weight` feature (ones when the input has none).
  """
  feeds = []
  for host in range(num_hosts):
    dataset = input_fn(host_params(params, num_hosts, cores_per_host, host, per_core_batch))
    batches = iter(dataset)
    feed = HostFeed(host, steps * cores_per_host, [], [], False)
    for features, labels in _take(batches, feed.wanted):
      feed.labels.append(np.asarray(labels))
      weight = features.get(schema.WEIGHT_KEY) if isinstance(features, dict) else None
      feed.weights.append(np.ones(len(labels)) if weight is None else np.asarray(weight))
    if check_end and not feed.ran_dry:
      feed.more_after = next(batches, None) is not None
    feeds.append(feed)
  return feeds


def _take(batches, count):
  for _ in range(count):
    batch = next(batches, None)
    if batch is None:
      return
    yield batch


def counted_labels(feeds):
  """The labels of every weight-1 example over all hosts, sorted: what evaluation counts."""
  counted = [labels[weights > 0] for feed in feeds
             for labels, weights in zip(feed.labels, feed.weights)]
  return np.sort(np.concatenate(counted)) if counted else np.array([], int)


def _train_finding(input_fn, pattern, params, hosts, cores, per_core_batch):
  feeds = feed_hosts(input_fn, params, hosts, cores, per_core_batch, steps=1)
  by_host = (input_pipeline.training_files_by_host(tf.io.gfile.glob(pattern), hosts)
             if pattern else [])
  files = (f"fewer non-empty files than hosts: each reads every file and keeps every "
           f"{hosts}th record" if by_host is None else
           "files per host: " + ", ".join(str(len(f)) for f in by_host) if by_host else
           "files not named")
  dry = [f for f in feeds if f.ran_dry]
  if dry:
    return Finding(FAIL, (
        f"train input on {hosts} hosts x {cores} cores: host {dry[0].host} fed "
        f"{dry[0].batches} of {dry[0].wanted} batches of a step ({files}); give every "
        f"host data: at least {hosts} non-empty train files"))
  return Finding(PASS, f"train input on {hosts} hosts x {cores} cores: every host feeds "
                       f"its {cores} cores every step ({files})")


def _eval_finding(input_fn, num_examples, params, hosts, cores, per_core_batch):
  steps = input_pipeline.eval_steps(num_examples, hosts * cores * per_core_batch)
  feeds = feed_hosts(input_fn, params, hosts, cores, per_core_batch, steps, check_end=True)
  counted = int(sum(w.sum() for f in feeds for w in f.weights))
  wrong = [f for f in feeds if f.ran_dry or f.more_after]
  if wrong or counted != num_examples:
    host = wrong[0] if wrong else feeds[0]
    return Finding(FAIL, (
        f"eval input on {hosts} hosts: {counted} of {num_examples} records counted; host "
        f"{host.host} fed {host.batches}{'+' if host.more_after else ''} of the "
        f"{host.wanted} batches TPUEstimator pulls in {steps} steps"))
  return Finding(PASS, (
      f"eval input on {hosts} hosts: {num_examples} records counted once each in {steps} "
      f"step{'' if steps == 1 else 's'}; every host feeds exactly {steps * cores} batches"))


def pod_findings(config, train_input_fn, eval_input_fn, train_pattern, params):
  """Preflight's pod check: drives the input_fns as every host of --num_cores would.

  Args:
    config: the run's Config (num_cores, cores_per_host, batch sizes, eval count).
    train_input_fn, eval_input_fn: the run's input_fns (eval may be None).
    train_pattern: the training file pattern, to name the files each host reads.
    params: the run's params (without batch_size and context).

  Returns:
    [Finding]: none for a single host.
  """
  r, t = config.runtime, config.train
  hosts, cores = r.num_cores // r.cores_per_host, r.cores_per_host
  if hosts <= 1:
    return []
  found = [_train_finding(train_input_fn, train_pattern, params, hosts, cores,
                          t.train_batch_size // r.num_cores)]
  if eval_input_fn is not None and config.data.num_eval_examples:
    found.append(_eval_finding(eval_input_fn, config.data.num_eval_examples, params, hosts,
                               cores, t.eval_batch_size // r.num_cores))
  return found
