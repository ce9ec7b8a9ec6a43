"""python -m estimator_tpu.compat {check PROGRAM.py ... | tables}.

  check   reads legacy programs without running them: each TF name they use,
          with its status, and a verdict per file; exit status 1 if any name
          is refused or unknown
  tables  docs/MIGRATING.md's tables, from the registry

With no command it prints this usage and exits 2.
"""

import argparse
import sys

from estimator_tpu.compat import check
from estimator_tpu.compat import registry

PROG = "python -m estimator_tpu.compat"


def _parser():
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", metavar="{check,tables}")
  checker = commands.add_parser("check", help="report the TF names legacy programs use, "
                                "without running them; exit 1 if any is refused or unknown")
  checker.add_argument("programs", nargs="+", metavar="PROGRAM.py")
  commands.add_parser("tables", help="print docs/MIGRATING.md's tables of TF 1 names")
  return parser


def parse_args(argv):
  """The parsed command line; no command is a usage error (exit 2)."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_usage(sys.stderr)
    parser.exit(2, f"{PROG}: error: name a command: check PROGRAM.py ... (what a legacy "
                   "program uses) or tables (every TF 1 name and its status); --help says more\n")
  return args


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.command == "check":
    return check.main(args.programs)
  print(registry.markdown_tables())
  return 0


if __name__ == "__main__":
  sys.exit(main())
