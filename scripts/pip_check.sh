#!/usr/bin/env bash
# `pip check` for a stack's venv. The current stack installs tensorflow-cpu and the tpu stack
# tensorflow-tpu, each of which provides the `tensorflow` package that tf-keras, tensorflow-serving-api and
# this project list as a requirement by its other name; those lines are expected, any other line fails
# the install.
# Usage: scripts/pip_check.sh VENV/bin/python
set -u
py=${1:?usage: pip_check.sh PYTHON}
out=$("$py" -m pip check --disable-pip-version-check 2>&1) && exit 0
provided_by_other_name=0
for name in tensorflow-cpu tensorflow-tpu; do
  "$py" -c "import importlib.metadata as m; m.version('$name')" 2>/dev/null && provided_by_other_name=1
done
if [ "$provided_by_other_name" = 1 ]; then
  rest=$(printf '%s\n' "$out" | grep -vE '^(tf-keras|tensorflow-serving-api|estimator-tpu|estimator_tpu) [^ ]+ requires tensorflow, which is not installed\.$')
else
  rest=$out
fi
[ -z "$rest" ] && exit 0
printf 'pip check failed:\n%s\n' "$rest" >&2
exit 1
