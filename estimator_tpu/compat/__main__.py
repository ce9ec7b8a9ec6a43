"""python -m estimator_tpu.compat [tables | check PROGRAM.py ...].

  tables  (also with no arguments) docs/MIGRATING.md's tables, from the registry
  check   reads legacy programs without running them: each TF name they use,
          with its status, and a verdict per file; exit status 1 if any name
          is refused or unknown
"""

import argparse
import sys

from estimator_tpu.compat import check
from estimator_tpu.compat import registry


def parse_args(argv):
  parser = argparse.ArgumentParser(prog="python -m estimator_tpu.compat",
                                   description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command")
  commands.add_parser("tables", help="print docs/MIGRATING.md's tables")
  checker = commands.add_parser("check", help="report the TF names legacy programs use")
  checker.add_argument("programs", nargs="+", metavar="PROGRAM.py")
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.command == "check":
    return check.main(args.programs)
  print(registry.markdown_tables())
  return 0


if __name__ == "__main__":
  sys.exit(main())
