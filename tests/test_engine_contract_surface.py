"""The TPUEstimator a program holds, on the distribute engine: its API, results, log and files.

TF 2.15's TPUEstimator (use_tpu=False) is the reference: every public name
of the installed one is on the engine with the same signature; the contract
programs estimator_surface.py and estimator_voice.py run on both engines and
must return the same values of the same types, log the same INFO lines in
the same order, and leave the same files and events (the graph's own files,
`.meta`, graph.pbtxt and graph_def events, aside: the engine writes no TF 1
graph).
"""

import glob
import inspect
import os
import re

import contract_programs
import numpy as np
import pytest
import tensorflow as tf

from estimator_tpu import stacks
from estimator_tpu.engines.distribute import engine as distribute_engine

# The lines that vary from run to run, whichever engine runs.
_VARYING = [(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", "TIME"),
            (r"\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d", "TIME"), (r"0x[0-9a-f]+", "ADDRESS"),
            (r"\b\d{10}\b", "STAMP"),
            (r"(global_step/sec|examples/sec|Inference Time) ?: [\d.e+-]+s?", r"\1: RATE")]
_NUMBER = re.compile(r"-?\d+\.\d+(e[+-]?\d+)?")
_RECORD = re.compile(r"^(INFO|WARNING|ERROR):tensorflow:(.*)$")
_GRAPH_EVENTS = ("graph_def", "meta_graph_def")


def _model_fn(features, labels, mode, params):
  del features, labels, mode, params


@pytest.fixture(scope="module")
def estimators(tmp_path_factory):
  """TensorFlow's TPUEstimator and the engine, over the same model_dir."""
  model_dir = str(tmp_path_factory.mktemp("surface"))
  config = stacks.tpu.RunConfig(model_dir=model_dir)
  real = stacks.tpu.TPUEstimator(model_fn=_model_fn, config=config, use_tpu=False,
                                 train_batch_size=8, params={"depth": 3})
  engine = distribute_engine.DistributeEngine(
      _model_fn, {"depth": 3}, tf.distribute.get_strategy(), model_dir, 8, 8, run_config=config,
      export_estimator_fn=lambda: real)
  return real, engine


def test_every_public_name_of_tpuestimator_is_on_the_engine_with_its_arguments(estimators):
  real, engine = estimators
  names = [name for name in dir(real) if not name.startswith("_")]
  assert {"train", "evaluate", "predict", "export_savedmodel", "model_fn"} <= set(names)
  for name in names:
    assert hasattr(engine, name), f"the engine lacks TPUEstimator.{name}"
    ours, theirs = getattr(type(engine), name, None), getattr(type(real), name)
    if inspect.isroutine(theirs):
      assert inspect.signature(ours) == inspect.signature(theirs), name
  assert engine.model_dir == real.model_dir
  assert engine.params == real.params == {"depth": 3}
  assert engine.params is not engine.params  # a copy each time, as the estimator's
  assert vars(engine.config) == vars(real.config)
  assert engine.eval_dir("holdout") == real.eval_dir("holdout")


def test_what_the_engine_cannot_do_without_its_estimator_is_refused_by_name(tmp_path):
  engine = distribute_engine.DistributeEngine(
      _model_fn, {}, tf.distribute.get_strategy(), str(tmp_path), 8, 8)
  with pytest.raises(ValueError, match=r"^export_savedmodel needs the TPUEstimator .*: build it"):
    engine.export_savedmodel(str(tmp_path), lambda: None)
  with pytest.raises(ValueError, match="Could not find trained model in model_dir"):
    engine.get_variable_value("global_step")


# --- estimator_surface.py: every method's results ---------------------------------------------


def _same_json(by_estimator, by_engine, path=""):
  """Asserts two results equal, floats within 1e-5."""
  if isinstance(by_estimator, float):
    assert by_engine == pytest.approx(by_estimator, rel=1e-5, abs=1e-6), path
  elif isinstance(by_estimator, dict):
    assert list(by_engine) == list(by_estimator), path
    for key, value in by_estimator.items():
      _same_json(value, by_engine[key], f"{path}/{key}")
  elif isinstance(by_estimator, list):
    assert len(by_engine) == len(by_estimator), path
    for i, (a, b) in enumerate(zip(by_estimator, by_engine)):
      _same_json(a, b, f"{path}[{i}]")
  else:
    assert by_engine == by_estimator, path


@pytest.mark.slow
def test_every_method_returns_what_the_estimator_returns(tmp_path):
  results, logs = {}, {}
  for engine in contract_programs.ENGINES:
    seen, _, stderr = contract_programs.run("estimator_surface.py", engine, tmp_path)
    model_dir = os.path.join(str(tmp_path), engine, "model")
    results[engine] = _replaced(seen, model_dir)
    logs[engine] = _shapes(_lines(stderr, model_dir))
  by_estimator, by_engine = results["estimator"], results["distribute"]
  for engine in contract_programs.OTHERS:
    _same_json(by_estimator, results[engine])
    # Every call said what the estimator says, errors included ("Reraising captured error").
    assert logs[engine] == logs["estimator"], engine
  assert ("INFO", "Skipping training since max_steps has already saved.") in logs["distribute"]
  # What the estimator gives, so the engine's is known to be it.
  assert by_engine["missing_names"] == []
  assert by_engine["max_steps_reached"] == [True, 0]  # returned at once: no input_fn call
  assert by_engine["listener"] == ["begin", "before_save 5", "after_save 5", "before_save 6",
                                   "after_save 6", "end 6"]
  evaluation = dict(by_engine["evaluate"]["items"])
  assert list(evaluation) == ["accuracy", "loss", "mean_logits", "global_step"]
  assert [evaluation[k]["type"] for k in evaluation] == ["float32", "float32", "ndarray", "int64"]
  assert dict(by_engine["evaluate_named"]["items"])["global_step"]["value"] == 5
  assert len(by_engine["predict"]) == 10 and len(by_engine["predict_tensor"]) == 10
  assert [v["type"] for _, v in by_engine["predict"][0]["items"]] == [
      "int64", "ndarray", "int32", "bytes"]
  assert {p["type"] for p in by_engine["predict_keys"]} == {"dict"}  # whole batches
  assert [len(dict(p["items"])["probabilities"]["value"]) for p in by_engine["predict_keys"]] == [
      4, 4, 2]
  assert by_engine["error_both_steps"] == "ValueError: Can not provide both steps and max_steps."
  untrained = dict(by_engine["evaluate_untrained"]["items"])  # from the initial values
  assert untrained["global_step"]["value"] == 0
  assert untrained["loss"]["value"] == pytest.approx(np.log(2))
  assert by_engine["after_finite_input"]["value"] == 9  # 3 batches, then the data ended
  assert by_engine["checkpoint_state"].splitlines()[1:] == [
      f'all_model_checkpoint_paths: "model.ckpt-{n}"' for n in (6, 8, 9)]
  assert by_engine["export_savedmodel"][0] == "bytes"


def _replaced(value, model_dir):
  """The results with the run's model_dir spelled MODEL."""
  if isinstance(value, str):
    return value.replace(model_dir, "MODEL")
  if isinstance(value, dict):
    return {k: _replaced(v, model_dir) for k, v in value.items()}
  if isinstance(value, list):
    return [_replaced(v, model_dir) for v in value]
  return value


# --- estimator_voice.py: the log, the files, the events ----------------------------------------


@pytest.fixture(scope="module")
def voices(tmp_path_factory):
  """{engine: (results, [(level, line)], model_dir)} of estimator_voice.py at INFO."""
  work = tmp_path_factory.mktemp("voice")
  runs = {}
  for engine in contract_programs.ENGINES:
    results, _, stderr = contract_programs.run("estimator_voice.py", engine, work)
    model_dir = os.path.join(str(work), engine, "model")
    runs[engine] = results, _lines(stderr, model_dir), model_dir
  return runs


def _lines(stderr, model_dir):
  """TensorFlow's log records (first lines), with what varies between runs replaced."""
  lines = []
  for line in stderr.splitlines():
    match = _RECORD.match(line)
    # The compat layer's own line says graph mode or eager execution, by engine. TF 2.15's
    # StepCounterHook reads the global step alongside the train op and, when its read comes
    # first, warns that the step "has not been increased"; the engine reads it after the step.
    if not match or match.group(2).startswith(("estimator_tpu.compat active",
                                               "It seems that global step")):
      continue
    text = match.group(2).replace(model_dir, "MODEL")
    for pattern, replacement in _VARYING:
      text = re.sub(pattern, replacement, text)
    lines.append((match.group(1), text))
  return lines


def _shapes(lines):
  """The lines with each number an N (NumPy pads an array's numbers to one width: one space)."""
  return [(level, re.sub(r"(?<=[\[N]) +(?=[N\]])", " ", _NUMBER.sub("N", text)))
          for level, text in lines]


OTHERS = contract_programs.OTHERS


@pytest.mark.slow
@pytest.mark.parametrize("engine", OTHERS)
def test_the_engine_logs_the_estimators_lines_in_its_order(voices, engine):
  by_estimator, by_engine = voices["estimator"][1], voices[engine][1]
  assert _shapes(by_engine) == _shapes(by_estimator)
  for (_, ours), (_, theirs) in zip(by_engine, by_estimator):
    numbers = [float(m.group()) for m in _NUMBER.finditer(ours)]
    assert numbers == pytest.approx([float(m.group()) for m in _NUMBER.finditer(theirs)],
                                    rel=1e-5), ours
  text = [line for _, line in by_engine]
  for expected in ("Saving checkpoints for 3 into MODEL/model.ckpt.", "Loss for final step: ",
                   "Saving dict for global step 6: accuracy = ", "Evaluation [2/2]",
                   "Saving 'checkpoint_path' summary for global step 6: MODEL/model.ckpt-6",
                   "SavedModel written to: MODEL/export/temp-STAMP/saved_model.pb"):
    assert any(line.startswith(expected) for line in text), expected
  # log_step_count_steps=2 over 6 steps: the rate at steps 3 and 5 (the first step starts it).
  assert text.count("global_step/sec: RATE") == 2


@pytest.mark.slow
def test_the_programs_verbosity_governs_the_engines_lines(tmp_path):
  _, _, stderr = contract_programs.run("estimator_voice.py", "distribute", tmp_path, "--quiet",
                                       fresh=True)
  assert not [line for line in stderr.splitlines() if line.startswith("INFO:tensorflow:")]


@pytest.mark.slow
@pytest.mark.parametrize("engine", OTHERS)
def test_the_engine_returns_the_estimators_results(voices, engine):
  by_estimator, by_engine = dict(voices["estimator"][0]), dict(voices[engine][0])
  assert by_engine.pop("export").isdigit() and by_estimator.pop("export").isdigit()
  _same_json(by_estimator, by_engine)
  assert len(by_engine["predictions"]) == 12


def _tree(model_dir):
  """model_dir's files, event files and export versions by their pattern; the graph's aside."""
  found = []
  for root, _, files in os.walk(model_dir):
    for name in files:
      path = os.path.relpath(os.path.join(root, name), model_dir)
      if path.endswith(".meta") or path == "graph.pbtxt":
        continue
      path = re.sub(r"events\.out\.tfevents\.[^/]+$", "events.out.tfevents.*", path)
      found.append(re.sub(r"\b\d{10}\b", "STAMP", path))
  return sorted(found)


@pytest.mark.slow
@pytest.mark.parametrize("engine", OTHERS)
def test_the_engine_leaves_the_estimators_files(voices, engine):
  by_estimator, by_engine = _tree(voices["estimator"][2]), _tree(voices[engine][2])
  assert by_engine == by_estimator
  assert "checkpoint" in by_engine and "eval_holdout/events.out.tfevents.*" in by_engine
  for engine in contract_programs.ENGINES:
    with open(os.path.join(voices[engine][2], "checkpoint")) as f:
      assert f.read().splitlines()[1:] == [
          f'all_model_checkpoint_paths: "model.ckpt-{n}"' for n in (0, 3, 6)]


def _events(directory):
  """(step, what, tag or status, value) of the one event file in directory, graphs aside."""
  (path,) = glob.glob(os.path.join(directory, "events.out.tfevents.*"))
  found = []
  for event in tf.compat.v1.train.summary_iterator(path):
    what = event.WhichOneof("what")
    if what == "summary":
      for value in event.summary.value:
        number = value.simple_value if value.HasField("simple_value") else (
            tf.make_ndarray(value.tensor).item())
        found.append((event.step, what, value.tag, number))
    elif what == "session_log":
      found.append((event.step, what, event.session_log.status,
                    os.path.basename(event.session_log.checkpoint_path)))
    elif what not in _GRAPH_EVENTS:
      found.append((event.step, what, "", None))
  return found


@pytest.mark.slow
@pytest.mark.parametrize("engine", OTHERS)
@pytest.mark.parametrize("directory", ["", "eval", "eval_holdout"])
def test_the_engine_writes_the_estimators_events(voices, directory, engine):
  by_estimator = _events(os.path.join(voices["estimator"][2], directory))
  by_engine = _events(os.path.join(voices[engine][2], directory))
  assert [e[:3] for e in by_engine] == [e[:3] for e in by_estimator]
  for ours, theirs in zip(by_engine, by_estimator):
    if str(ours[2]).endswith("/sec"):
      continue  # a rate: its value is the run's own
    if isinstance(theirs[3], float):
      assert ours[3] == pytest.approx(theirs[3], rel=1e-5), ours
    elif isinstance(theirs[3], bytes):
      assert ours[3].replace(engine.encode(), b"estimator") == theirs[3]
    else:
      assert ours[3] == theirs[3], ours
  tags = {e[2] for e in by_engine}
  log = tf.compat.v1.SessionLog
  expected = {"loss", "global_step/sec", "examples/sec", log.START, log.CHECKPOINT} if (
      not directory) else {
      "accuracy", "loss", "checkpoint_path"}
  assert expected <= tags
