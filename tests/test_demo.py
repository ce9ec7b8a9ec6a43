"""`make demo`'s own commands, short, on an AVX-512/AMX-like host: only this project's lines."""

import os
import re
import subprocess
import sys

from conftest import program_env
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every line the demo may print, one pattern per kind: its commands (make echoes
# them), and each program's own lines.
OUR_LINES = [
    re.compile(pattern) for pattern in (
        r"rm -rf \S+$",
        r"\S+python\S* (-m estimator_tpu\.data\.digits|preprocess\.py|train\.py"
        r"|-m serving\.predict) ",
        r"  --",  # continuation lines of a command
        r"wrote \d+ digit JPEGs ",
        r"preprocess\.py: ",
        r"={20,}$",  # preprocess.py's summary: a ruled block of counts
        r"  (train|validation) +\d+ images in \d+ shard\(s\)$",
        r"  rejected +\d+$",
        r"  output +\S+$",
        r"\[estimator_tpu\] ",
        r"(python -m )?serving\.predict: ",
        r"wrote \d+ rows to ",
        r"accuracy \d\.\d{4} ",
    )
]


@pytest.mark.slow
def test_demo_prints_only_its_own_lines_and_serves_what_it_trained(tmp_path):
  demo = tmp_path / "demo"
  done = subprocess.run(
      ["make", "--no-print-directory", "demo-run", f"PY={sys.executable}", f"DEMO={demo}",
       "DEMO_LIMIT=400", "DEMO_STEPS=20", "DEMO_EVAL_STEPS=10"],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=program_env(TF_CPP_MIN_LOG_LEVEL="3"))
  output = done.stdout + done.stderr
  assert done.returncode == 0, output[-3000:]
  strangers = [line for line in output.splitlines()
               if line.strip() and not any(p.match(line) for p in OUR_LINES)]
  assert strangers == [], "\n".join(strangers)
  assert len(re.findall(r"^\[estimator_tpu\] step (10|20)/20 ", output, re.M)) == 2
  rows = (demo / "predictions.csv").read_text().splitlines()
  served = int(re.search(r"^wrote (\d+) rows to ", output, re.M).group(1))
  assert served == len(rows) - 1 > 0
