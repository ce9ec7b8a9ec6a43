"""Where the suite's time goes: `pytest --timings=PATH` writes one JSON line per test phase.

Each line holds the phase's wall seconds, the CPU seconds of the test process and of the
programs it started and waited for, how many programs it started, and the wall seconds it
spent in-process training, evaluating or predicting, exporting and running Beam pipelines
(the outermost call of each kind is timed). Under pytest-xdist the workers measure and the
controller writes the file. `python tests/timings.py PATH` prints the tables of tests/README.md.
"""

import collections
import contextlib
import functools
import json
import os
import resource
import subprocess
import sys
import threading
import time

_KINDS = ("train", "export", "beam")
_state = threading.local()
_totals = collections.Counter()
_started = []  # the programs the running test phase started


def _timed(kind, fn):
  """fn, its outermost calls' wall seconds added to _totals[kind] (generators while consumed)."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with _outermost(kind):
      result = fn(*args, **kwargs)
    if hasattr(result, "__next__"):
      return _timed_iterator(kind, result)
    return result

  return wrapper


def _timed_iterator(kind, iterator):
  while True:
    with _outermost(kind):
      try:
        item = next(iterator)
      except StopIteration:
        return
    yield item


@contextlib.contextmanager
def _outermost(kind):
  depth = getattr(_state, kind, 0)
  setattr(_state, kind, depth + 1)
  start = time.perf_counter()
  try:
    yield
  finally:
    setattr(_state, kind, depth)
    if depth == 0:
      _totals[kind] += time.perf_counter() - start


def _patch(owner, name, kind):
  method = getattr(owner, name, None)
  if method is not None and not getattr(method, "_timings_kind", None):
    wrapped = _timed(kind, method)
    wrapped._timings_kind = kind
    setattr(owner, name, wrapped)


def program_name(command):
  """A short name for a command line: its script, `-m module`, `-c`, or its executable."""
  words = command.split() if isinstance(command, str) else [str(word) for word in command]
  for index, word in enumerate(words[1:], 1):
    if word.endswith(".py"):
      return "/".join(word.split("/")[-2:]) if "legacy_corpus" in word else os.path.basename(word)
    if word in ("-m", "-c"):
      return f"-m {words[index + 1]}" if word == "-m" else "-c"
  return os.path.basename(words[0]) if words else "?"


def _count_starts(popen_init):
  @functools.wraps(popen_init)
  def init(self, args, *more, **kwargs):
    _totals["programs"] += 1
    _started.append(program_name(args))
    return popen_init(self, args, *more, **kwargs)

  return init


def count_program(command):
  """Counts a program started without Popen (tests/programs.py forks it from a zygote)."""
  _totals["programs"] += 1
  _started.append(program_name(command))


def count_program_cpu(seconds):
  """Adds the CPU seconds of such a program, reported when it ended, to the programs' CPU."""
  _totals["forked_cpu"] += seconds


def install():
  """Wraps the library's train/evaluate/predict/export calls, Beam's run and Popen once."""
  from apache_beam import pipeline as beam_pipeline

  from estimator_tpu import stacks
  from estimator_tpu.engines import strategy_estimator
  from estimator_tpu.engines.distribute import engine
  from estimator_tpu.export import saved_model
  for owner in (stacks.estimator.Estimator, engine.DistributeEngine,
                strategy_estimator.StrategyEstimator):
    for name in ("train", "evaluate", "predict"):
      _patch(owner, name, "train")
    _patch(owner, "export_saved_model", "export")
  _patch(saved_model, "export_saved_model", "export")
  _patch(beam_pipeline.Pipeline, "run", "beam")
  subprocess.Popen.__init__ = _count_starts(subprocess.Popen.__init__)


def _usage():
  me = resource.getrusage(resource.RUSAGE_SELF)
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return {"cpu": me.ru_utime + me.ru_stime,
          "children_cpu": children.ru_utime + children.ru_stime + _totals["forked_cpu"],
          **{kind: _totals[kind] for kind in (*_KINDS, "programs")}}


@contextlib.contextmanager
def measured(item, phase):
  """Records on item the usage of one phase (setup, call, teardown)."""
  before = _usage()
  del _started[:]
  try:
    yield
  finally:
    after = _usage()
    figures = {key: round(after[key] - before[key], 3) for key in after}
    if _started:
      figures["started"] = list(_started)
    item.stash.setdefault(_STASH, {})[phase] = figures


def attach(item, report):
  """Adds the phase's figures to report.user_properties (xdist sends them to the controller)."""
  figures = item.stash.get(_STASH, {}).get(report.when)
  if figures:
    figures["slow"] = item.get_closest_marker("slow") is not None
    report.user_properties.append(("timings", figures))


def write(path, report):
  """Appends one phase's line to path (the controller's, or the only, process)."""
  figures = dict(report.user_properties).get("timings", {})
  line = {"test": report.nodeid, "phase": report.when, "wall": round(report.duration, 3),
          "start": round(report.start, 3), "worker": getattr(report, "worker_id", None)
          or (getattr(getattr(report, "node", None), "gateway", None) and report.node.gateway.id),
          "outcome": report.outcome, **figures}
  with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")


try:
  import pytest
  _STASH = pytest.StashKey[dict]()
except ImportError:  # the summary below runs without pytest
  _STASH = None


# --- the summary ----------------------------------------------------------------------------

def _read(path):
  tests = collections.defaultdict(collections.Counter)
  for line in open(path):
    record = json.loads(line)
    figures = tests[record["test"]]
    for key in ("wall", "cpu", "children_cpu", "programs", *_KINDS):
      figures[key] += record.get(key, 0)
    if record["phase"] == "call":
      figures["first_start"] = figures["first_start"] or record["start"]
  return tests


def summarize(path, top=30, startup_cpu=None):
  """Prints the top tests, the sums per file and the sums by kind, as Markdown tables."""
  tests = _read(path)
  total = sum(t["wall"] for t in tests.values())
  print(f"{len(tests)} tests, {total:.0f} s of test wall time, "
        f"{sum(t['cpu'] + t['children_cpu'] for t in tests.values()):.0f} CPU s\n")
  print("| test | wall s | share | CPU s (own + programs') | programs |")
  print("| --- | ---: | ---: | ---: | ---: |")
  ranked = sorted(tests.items(), key=lambda kv: -kv[1]["wall"])
  for name, t in ranked[:top]:
    print(f"| `{name.removeprefix('tests/')}` | {t['wall']:.1f} | {100 * t['wall'] / total:.1f}% "
          f"| {t['cpu']:.0f} + {t['children_cpu']:.0f} | {t['programs']:.0f} |")
  files = collections.defaultdict(collections.Counter)
  for name, t in tests.items():
    files[name.split("::")[0]].update(t)
    files[name.split("::")[0]]["tests"] += 1
  print("\n| file | tests | wall s | share | programs | in programs (CPU s) | train | export |"
        " beam |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for name, t in sorted(files.items(), key=lambda kv: -kv[1]["wall"]):
    print(f"| `{name.removeprefix('tests/')}` | {t['tests']} | {t['wall']:.0f} "
          f"| {100 * t['wall'] / total:.1f}% | {t['programs']:.0f} | {t['children_cpu']:.0f} "
          f"| {t['train']:.0f} | {t['export']:.0f} | {t['beam']:.0f} |")
  sums = collections.Counter()
  for t in tests.values():
    sums.update(t)
  print("\n| kind | seconds | of |")
  print("| --- | ---: | --- |")
  print(f"| programs started (train.py, export.py, preprocess.py, corpus and contract programs, "
        f"pip, make) | {sums['programs']:.0f} | starts |")
  print(f"| CPU in those programs | {sums['children_cpu']:.0f} | CPU s |")
  if startup_cpu:
    print(f"| of which TensorFlow's start-up ({startup_cpu:.1f} CPU s a program) | "
          f"{sums['programs'] * startup_cpu:.0f} | CPU s (at most) |")
  print(f"| in-process train/evaluate/predict | {sums['train']:.0f} | wall s |")
  print(f"| in-process exports | {sums['export']:.0f} | wall s |")
  print(f"| in-process Beam pipelines | {sums['beam']:.0f} | wall s |")
  print(f"| CPU of the test processes | {sums['cpu']:.0f} | CPU s |")


def file_seconds(path, slow_ids=None):
  """{test file: {"slow": s, "other": s}}: CPU seconds (test process and programs) of a log.

  Whether a test is marked slow comes from the log, or for older logs from slow_ids.
  """
  seconds = collections.defaultdict(lambda: {"slow": 0.0, "other": 0.0})
  slow = set()
  for line in open(path):
    record = json.loads(line)
    if record.get("slow") or record["test"] in (slow_ids or ()):
      slow.add(record["test"])
  for name, figures in _read(path).items():
    kind = "slow" if name in slow else "other"
    seconds[name.split("::")[0]][kind] += figures["cpu"] + figures["children_cpu"]
  return seconds


def write_durations(log_path, durations_path, slow_ids=None):
  """Writes tests/durations.json: each test file's CPU seconds, slow tests and the others."""
  seconds = file_seconds(log_path, slow_ids)
  ranked = sorted(seconds.items(), key=lambda kv: -sum(kv[1].values()))
  rows = [f"  {json.dumps(name)}: {json.dumps({k: round(v, 1) for k, v in parts.items()})}"
          for name, parts in ranked]
  with open(durations_path, "w") as f:
    f.write(f'{{"about": {json.dumps(DURATIONS_ABOUT)},\n "seconds": {{\n'
            + ",\n".join(rows) + "\n}}\n")


DURATIONS_ABOUT = ("CPU seconds of each test file's slow tests and other tests (the test process "
                   "and the programs it starts) on the default stack; conftest.py starts the "
                   "files whose selected tests take longest first. Written by `python "
                   "tests/timings.py LOG --durations tests/durations.json`.")


def read_durations(path):
  """{test file: {"slow": s, "other": s}} of a durations file; {} where there is none."""
  try:
    with open(path) as f:
      return json.load(f)["seconds"]
  except FileNotFoundError:
    return {}


def longest_first(items, seconds):
  """Sorts pytest items so that the files whose selected tests take longest come first.

  A file's tests keep their order; a file the durations do not know comes first
  (it may be long). With pytest-xdist's --dist loadfile (and --no-loadscope-reorder,
  which keeps this order) a worker that finishes a file takes the next longest,
  so no long file is left to start last.
  """
  selected = collections.defaultdict(set)
  for item in items:
    selected[item.nodeid.split("::")[0]].add(
        "slow" if item.get_closest_marker("slow") else "other")
  cost = {}
  for name, kinds in selected.items():
    known = seconds.get(name)
    cost[name] = sum(known[kind] for kind in kinds) if known else float("inf")
  items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])


if __name__ == "__main__":
  if len(sys.argv) >= 4 and sys.argv[2] == "--durations":
    write_durations(sys.argv[1], sys.argv[3],
                    set(open(sys.argv[4]).read().split()) if len(sys.argv) > 4 else None)
  else:
    summarize(sys.argv[1], startup_cpu=float(os.environ.get("STARTUP_CPU", "0")) or None)
