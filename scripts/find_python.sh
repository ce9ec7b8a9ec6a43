#!/usr/bin/env bash
# Prints the path of a Python X.Y interpreter, looked up the way a user's machine offers it:
# pythonX.Y on PATH, then pyenv's versions, then /usr/local/bin and /usr/bin.
# Usage: scripts/find_python.sh 3.12
set -u
want=${1:?usage: find_python.sh X.Y}
works() { "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))" 2>/dev/null; }
candidates=("python$want")
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root 2>/dev/null)
  for p in "$root"/versions/"$want".*/bin/python; do candidates+=("$p"); done
fi
candidates+=("/usr/local/bin/python$want" "/usr/bin/python$want")
for p in "${candidates[@]}"; do
  if works "$p"; then command -v "$p"; exit 0; fi
done
echo "error: no Python $want found (looked for python$want on PATH, in pyenv's versions, /usr/local/bin and /usr/bin)." >&2
echo "  Install it (e.g. 'pyenv install $want' or your system's python$want package), or name one: make PYTHON=/path/to/python$want" >&2
exit 1
