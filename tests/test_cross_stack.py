"""A SavedModel exported on this stack predicts the same on another (TF Serving version skew)."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from estimator_tpu import stacks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The venv `make install STACK=...` builds for each stack; .ci/run builds them before testing.
VENVS = {"current": ".venv", "tf2.15": ".venv-tf2.15", "tpu": ".venv-tpu"}
# current and tf2.15 serve each other's exports (TF 2.21 <-> 2.15); the tpu stack's export (TF 2.20,
# trained where a TPU VM trains) is served by the current stack, as a TF Serving of today would.
OTHER = {"current": "tf2.15", "tf2.15": "current", "tpu": "current"}[stacks.NAME]
OTHER_PYTHON = os.path.join(REPO, VENVS[OTHER], "bin", "python")
OTHER_READY = os.path.exists(os.path.join(REPO, VENVS[OTHER], ".installed"))


def _predict(python, saved_model, records, output):
  """serving.predict under `python`; returns {id: (probabilities, error)} from its CSV."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
  env.pop("TF_USE_LEGACY_KERAS", None)  # set by this process's import of estimator_tpu
  done = subprocess.run([python, "-m", "serving.predict", f"--saved_model={saved_model}",
                         f"--input={records}", f"--output={output}", "--all_probabilities"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, f"{python}: {done.stderr[-3000:]}"
  with open(output, newline="") as f:
    rows = list(csv.DictReader(f))
  class_columns = [k for k in rows[0] if k not in ("id", "label", "probability", "error")]
  return {row["id"]: ([float(row[k]) for k in class_columns], row["error"]) for row in rows}


@pytest.mark.skipif(not OTHER_READY, reason=f"the {OTHER} stack's venv is not built "
                    f"(make install STACK={OTHER}); .ci/run builds it")
def test_export_from_this_stack_predicts_the_same_on_the_other(exported_model, digits_dir,
                                                               tmp_path):
  records = os.path.join(digits_dir, "validation-*")
  here = _predict(sys.executable, exported_model, records, str(tmp_path / "here.csv"))
  there = _predict(OTHER_PYTHON, exported_model, records, str(tmp_path / "there.csv"))
  assert len(here) == 37 and here.keys() == there.keys()
  for key, (probabilities, error) in here.items():
    other_probabilities, other_error = there[key]
    assert error == other_error == ""
    assert len(probabilities) == 10
    np.testing.assert_allclose(probabilities, other_probabilities, atol=1e-4)
    assert int(np.argmax(probabilities)) == int(np.argmax(other_probabilities))
