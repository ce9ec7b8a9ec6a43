"""Preflight's findings: PASS, WARN or FAIL with a message, the verdict line and the report."""

import dataclasses
import sys

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclasses.dataclass(frozen=True)
class Finding:
  status: str
  message: str

  def __str__(self):
    return f"{self.status}  {self.message}"


def verdict(findings):
  """(last report line, exit status)."""
  failures = sum(f.status == FAIL for f in findings)
  warnings = sum(f.status == WARN for f in findings)
  counts = f"{failures} failed, {warnings} warning{'' if warnings == 1 else 's'}"
  if failures:
    return f"preflight: FAIL ({counts}): fix the FAIL lines before a TPU run", 1
  return f"preflight: PASS ({counts}): ready for --use_tpu --tpu=NAME", 0


def report(findings, out=None):
  """Prints the findings and the verdict line; returns the exit status (0 or 1)."""
  out = out or sys.stdout
  for finding in findings:
    print(finding, file=out)
  line, status = verdict(findings)
  print(line, file=out, flush=True)
  return status
