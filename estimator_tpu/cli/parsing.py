"""A command's flags parsed by absl before TensorFlow loads: --help, and exit 2 for a bad flag.

absl's own --help lists the flags of the main module only (none: ours are
defined in estimator_tpu.flags), exits 1 and takes as long as the imports
before it; a misspelt flag ends in `FATAL Flags parsing error`, exit 1. Here
--help lists the command's own flags first, with their help text, and exits
0; --helpfull adds absl's; an unknown flag or a bad value prints one line,
with the nearest flag's name, and exits 2.
"""

import difflib
import os
import sys

from absl import flags

from estimator_tpu import cli

HELP_FLAGS = ("-h", "-?", "--help", "--helpshort")
HELPFULL_FLAG = "--helpfull"
_WIDTH = 100
_CUTOFF = 0.6  # difflib's similarity for "did you mean" (--exprot: --export_dir)


def flags_parser(program, usage, groups, flag_values=flags.FLAGS, known_only=False,
                 more_help=""):
  """absl app.run's flags_parser for a command.

  Args:
    program: the name it was run by (cli.program_name()).
    usage: what it does and how it is called (its module docstring).
    groups: [(title, [flag name])]: its own flags, in the order --help lists them.
    flag_values: where the flags are defined.
    known_only: leave unknown flags in the returned argv (for a command that
      passes them on, as preprocess.py passes Beam's options).
    more_help: text --help prints after the flags.

  Returns:
    parse(argv) -> the arguments left after the flags.
  """

  def parse(argv):
    asked = [arg for arg in argv[1:] if arg in HELP_FLAGS + (HELPFULL_FLAG,)]
    if asked:
      _print_help(help_text(program, usage, groups, flag_values, more_help,
                            full=HELPFULL_FLAG in asked))
      sys.exit(0)
    try:
      return flag_values(argv, known_only=known_only)
    except flags.UnrecognizedFlagError as e:
      sys.exit(cli.fail(program, unknown_flag_message(e.flagname, flag_values, program),
                        cli.EXIT_USAGE))
    except flags.Error as e:
      sys.exit(cli.fail(program, f"{e}; {program} --help lists the flags", cli.EXIT_USAGE))

  return parse


def unknown_flag_message(name, flag_values, program, what="flag"):
  """`unknown flag --name; did you mean --nearest?` (the nearest of flag_values' names)."""
  name = name.lstrip("-").split("=", 1)[0]
  known = []
  for flag_name in flag_values:
    known.append(flag_name)
    if flag_values[flag_name].boolean:
      known.append("no" + flag_name)
  close = difflib.get_close_matches(name, known, n=1, cutoff=_CUTOFF)
  hint = f"; did you mean --{close[0]}?" if close else f"; {program} --help lists the flags"
  return f"unknown {what} --{name}{hint}"


def check_argparse_flags(parser, argv):
  """For an argparse command: exits 2 on the first unknown --flag, with the nearest one.

  Checked before argparse parses, so that a misspelt flag is named rather than
  the required flag it leaves missing.
  """
  known = [option for action in parser._actions  # pylint: disable=protected-access
           for option in action.option_strings]
  for arg in argv:
    name = arg.split("=", 1)[0]
    if not name.startswith("--") or name == "--":
      continue
    if name not in known and len([k for k in known if k.startswith(name)]) != 1:
      close = difflib.get_close_matches(name, known, n=1, cutoff=_CUTOFF)
      hint = f"; did you mean {close[0]}?" if close else f"; {parser.prog} --help lists the flags"
      sys.exit(cli.fail(parser.prog, f"unknown flag {name}{hint}", cli.EXIT_USAGE))


def help_text(program, usage, groups, flag_values, more_help="", full=False):
  """The text --help prints: usage, then each group's flags with their help and default."""
  lines = [usage.strip(), ""]
  listed = set()
  for title, names in groups:
    lines.append(f"{title}:")
    for name in names:
      lines.extend(_describe(flag_values[name]))
      listed.add(name)
    lines.append("")
  if more_help:
    lines += [more_help.strip(), ""]
  if full:
    lines.append("absl's flags:")
    for name in sorted(set(flag_values) - listed):
      flag = flag_values[name]
      if name == flag.name and not name.startswith(("help", "?")):
        lines.extend(_describe(flag))
  else:
    lines.append(f"absl's own flags (--flagfile, --logtostderr, ...): {program} --helpfull")
  return "\n".join(lines)


def _describe(flag):
  """The lines of one flag, in absl's form: `--[no]name: help`, then its default if any."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  text = flags.text_wrap(f"{name}: {flag.help}", _WIDTH, indent="      ",
                         firstline_indent="  ")
  if flag.default in (None, "", ()):
    return [text]
  return [text, f"      (default: {flag.default_as_str})"]


def _print_help(text):
  """Prints text; a reader that stops early (`--help | head`) is no error."""
  try:
    print(text, flush=True)
  except BrokenPipeError:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
