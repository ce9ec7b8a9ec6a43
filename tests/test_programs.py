"""tests/programs.py: a program forked from the zygote gives what a new Python gives."""

import os
import signal
import sys
import textwrap

from conftest import program_env
import programs
import pytest

PROGRAM = textwrap.dedent("""
    import atexit, os, sys, threading, time
    print(sys.argv[1:], os.getcwd(), os.environ.get("PROGRAMS_TEST"), __name__, sys.path[0])
    print("to stderr", file=sys.stderr)
    def late():
      time.sleep(0.2)
      with open(os.path.join(os.getcwd(), "thread.txt"), "w") as f:
        f.write("joined")
    threading.Thread(target=late).start()  # not a daemon: Python waits for it
    atexit.register(lambda: print("atexit ran"))
    sys.exit(int(sys.argv[1]))
""")


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_code_sees_its_arguments_place_and_environment_and_exits_as_python(tmp_path, fresh):
  done = programs.run([sys.executable, "-c", PROGRAM, "3", "x y"], cwd=str(tmp_path),
                      capture_output=True, text=True, timeout=120, fresh=fresh,
                      env=program_env(PROGRAMS_TEST="seen", TF_CONFIG="{}"))
  assert done.returncode == 3, done.stderr
  assert done.stdout.splitlines() == [f"['3', 'x y'] {tmp_path} seen __main__ ", "atexit ran"]
  assert done.stderr == "to stderr\n"
  assert (tmp_path / "thread.txt").read_text() == "joined"


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_script_and_a_module_run_as_main_with_pythons_path(tmp_path, fresh):
  script = tmp_path / "prog.py"
  script.write_text("import sys\nprint(__name__, __file__, sys.path[0], sys.argv[1:])\n"
                    "raise ValueError('boom')\n")
  done = programs.run([sys.executable, str(script), "--flag"], cwd=str(tmp_path), fresh=fresh,
                      capture_output=True, text=True, timeout=120, env=program_env())
  assert done.returncode == 1
  assert done.stdout == f"__main__ {script} {tmp_path} ['--flag']\n"
  assert done.stderr.splitlines()[-1] == "ValueError: boom"
  module = programs.run([sys.executable, "-m", "json.tool", "--compact"], input='{"a": [1, 2]}',
                        capture_output=True, text=True, timeout=120, fresh=fresh,
                        env=program_env())
  assert (module.returncode, module.stdout) == (0, '{"a":[1,2]}\n'), module.stderr


def test_a_forked_program_starts_with_tensorflow_loaded_and_a_fresh_one_without(tmp_path):
  code = "import sys; print('tensorflow' in sys.modules, 'estimator_tpu' in sys.modules)"
  forked, fresh = (programs.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=120, env=program_env(), fresh=new)
                   for new in (False, True))
  assert forked.stdout.split() == ["True", "True"], forked.stderr  # on every stack
  assert fresh.stdout.split() == ["False", "False"], fresh.stderr


def test_signals_reach_the_program_and_its_status_is_subprocess_s():
  waits = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))\n"
           "print('waiting', flush=True)\n"
           "time.sleep(60)\n")
  handled = programs.start([sys.executable, "-c", waits], stdout=programs.PIPE, text=True,
                           env=program_env())
  assert handled.stdout.readline() == "waiting\n"
  assert handled.poll() is None
  handled.terminate()
  assert handled.wait(timeout=30) == 75
  killed = programs.start([sys.executable, "-c", "import time; time.sleep(60)"],
                          env=program_env())
  killed.send_signal(signal.SIGKILL)
  assert killed.wait(timeout=30) == -signal.SIGKILL
  with pytest.raises(programs.subprocess.TimeoutExpired):
    programs.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1,
                 env=program_env())


def test_what_is_not_this_python_running_a_program_starts_afresh(tmp_path):
  done = programs.run(["sh", "-c", "echo $0 $PPID > out.txt", "sh"], cwd=str(tmp_path),
                      timeout=60)
  assert done.returncode == 0
  assert (tmp_path / "out.txt").read_text().split()[1] == str(os.getpid())
