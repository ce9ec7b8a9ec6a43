"""The programs the tests start: forked from a process that has already loaded TensorFlow.

Most of the suite's time was TensorFlow's start-up (about 5 CPU seconds for
`import tensorflow`, more on the tpu stack) paid again by each of some three
hundred programs. `run()` and `start()` take the arguments of `subprocess.run`
and `subprocess.Popen` that the tests use and start `python SCRIPT`,
`python -m MODULE` or `python -c CODE` as a child forked from a "zygote": a
process of this file, started once per pytest worker and environment, that
has imported what every program here imports first (estimator_tpu, then
TensorFlow) and waits on a socket. The child takes the request's environment,
working directory, arguments and file descriptors (pipes the caller reads, as
subprocess gives), runs the program as `__main__` and ends as Python ends (its
non-daemon threads joined, atexit run, its exit status what `python` exits
with); the zygote reports the status and the child's CPU seconds.

What a forked child does not repeat is the start-up itself: what TensorFlow
and this package do and print while they load. A test about that (a quiet
start, an import order, an installed copy of the package, a stack's start-up
guard) passes `fresh=True` and gets `subprocess` itself; so does any command
that is not this Python running a script, a module or code. The environment
read while loading (everything but RUNTIME_ONLY and pytest's own variables) is
the zygote's key: a program with another gets another zygote, started then
with exactly that environment.
"""

import atexit
import contextlib
import io
import json
import locale
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import timings

# Variables read only when the program runs (by the cluster resolver, the engine choice, the
# progress lines; XLA_FLAGS by TensorFlow's and JAX's XLA when each first compiles or starts its
# backend), never while estimator_tpu or TensorFlow loads: they do not choose the zygote.
RUNTIME_ONLY = frozenset({"TF_CONFIG", "ESTIMATOR_TPU_ENGINE", "ESTIMATOR_TPU_STRATEGY",
                          "ESTIMATOR_TPU_PROGRESS_SECS", "ESTIMATOR_TPU_COMPAT_EXECUTION",
                          "XLA_FLAGS"})
PRELOAD = ("estimator_tpu", "tensorflow")  # in this order, as a program's first line does
# Then what most programs import later (the estimator, the learning curves, the corpus' digits):
# 0.1, 0.5 and 0.8 CPU s that a forked program importing them no longer pays; skipped where
# not installed.
PRELOAD_IF_INSTALLED = ("tensorflow_estimator", "matplotlib.pyplot", "sklearn.datasets")
_MAX_ZYGOTES = 3  # per pytest worker; the least recently used one goes first
_READY_SECS = 300
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL


# What importing scikit-learn sets where the environment lacks it (os.environ.setdefault): the
# test process has it once a test has loaded the digits, and every zygote once it has loaded
# PRELOAD_IF_INSTALLED, so an environment without it asks for the same zygote as one with it.
# (Left in the key, the first digits made every later environment need a zygote of its own.)
_SET_BY_IMPORTS = {"KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE"}


def _key(env):
  return tuple(sorted((name, value) for name, value in {**_SET_BY_IMPORTS, **env}.items()
                      if name not in RUNTIME_ONLY and not name.startswith("PYTEST_")))


class _Zygote:
  """One zygote process (this file run as a program) and the socket it listens on."""

  def __init__(self, key):
    self._dir = tempfile.mkdtemp(prefix="zygote-")
    self.address = os.path.join(self._dir, "socket")
    self._log = open(os.path.join(self._dir, "log"), "w+")
    self.children_cpu = 0.0  # reported by the zygote as each child ended
    self.startup_cpu = 0.0  # its own, to load PRELOAD: reported when it is ready
    self.process = subprocess.Popen(  # timings counts it as one program start
        [sys.executable, os.path.abspath(__file__), self.address], env=dict(key),
        cwd=os.path.dirname(os.path.abspath(__file__)), stdin=PIPE, stdout=PIPE,
        stderr=self._log)
    ready, _, _ = select.select([self.process.stdout], [], [], _READY_SECS)
    line = self.process.stdout.readline() if ready else b""
    if not line.startswith(b"ready"):
      self.close()
      self._log.seek(0)
      raise RuntimeError(f"the zygote ({__file__}) did not start: {self._log.read()[-3000:]}")
    # Counted now, for the test that needed it, rather than when the zygote is reaped.
    self.startup_cpu = float(line.split()[1])
    timings.count_program_cpu(self.startup_cpu)

  def spawn(self, request, fds):
    """Forks a child for request with fds as its 0, 1, 2; returns (pid, connection)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.connect(self.address)
    socket.send_fds(connection, [json.dumps(request).encode()], fds)
    reply = json.loads(connection.recv(1 << 16))
    return reply["pid"], connection

  def close(self):
    with contextlib.suppress(OSError):
      self.process.stdin.close()  # the zygote exits when its stdin ends
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=10)
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()
    # Reaping the zygote adds its children's CPU and its start-up's to this process's children's
    # again.
    timings.count_program_cpu(-self.children_cpu - self.startup_cpu)
    self._log.close()
    for name in ("socket", "log"):
      with contextlib.suppress(OSError):
        os.unlink(os.path.join(self._dir, name))
    with contextlib.suppress(OSError):
      os.rmdir(self._dir)


_zygotes = {}  # key -> _Zygote, least recently used first
_zygotes_lock = threading.Lock()


def _zygote(env):
  key = _key(env)
  with _zygotes_lock:
    zygote = _zygotes.pop(key, None)
    if zygote is None or zygote.process.poll() is not None:
      zygote = _Zygote(key)
    _zygotes[key] = zygote
    while len(_zygotes) > _MAX_ZYGOTES:
      _zygotes.pop(next(iter(_zygotes))).close()
    return zygote


@atexit.register
def close_all():
  with _zygotes_lock:
    while _zygotes:
      _zygotes.popitem()[1].close()


def _forkable(args):
  """Whether args is this Python running a script, `-m module` or `-c code` (and no options)."""
  return (isinstance(args, (list, tuple)) and len(args) >= 2
          and args[0] == sys.executable
          and (args[1] in ("-m", "-c") and len(args) >= 3 or not args[1].startswith("-")))


class Popen:
  """A forked program with subprocess.Popen's surface: pid, poll, wait, communicate, signals."""

  def __init__(self, args, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None,
               text=None):
    self.args = [str(arg) for arg in args]
    self.returncode = None
    self._text = bool(text)
    parent_ends, child_fds, to_close = {}, [], []
    for fd, choice in enumerate((stdin, stdout, stderr)):
      if choice == PIPE:
        read, write = os.pipe()
        mine, theirs = (write, read) if fd == 0 else (read, write)
        parent_ends[fd] = mine
        child_fds.append(theirs)
        to_close.append(theirs)
      elif choice == DEVNULL:
        null = os.open(os.devnull, os.O_RDWR)
        child_fds.append(null)
        to_close.append(null)
      elif choice == STDOUT and fd == 2:
        child_fds.append(child_fds[1])
      elif choice is None:
        child_fds.append(fd)
      else:  # a file object or a descriptor
        child_fds.append(choice if isinstance(choice, int) else choice.fileno())
    request = {"argv": self.args[1:], "cwd": os.path.abspath(cwd or os.getcwd()),
               "env": dict(os.environ if env is None else env)}
    try:
      self._zygote = _zygote(request["env"])
      self.pid, self._connection = self._zygote.spawn(request, child_fds)
    finally:
      for fd in to_close:
        os.close(fd)
    self.stdin = self._stream(parent_ends.get(0), "w")
    self.stdout = self._stream(parent_ends.get(1), "r")
    self.stderr = self._stream(parent_ends.get(2), "r")

  def _stream(self, fd, mode):
    if fd is None:
      return None
    if not self._text:
      return open(fd, mode + "b")
    return io.TextIOWrapper(open(fd, mode + "b"), encoding=locale.getpreferredencoding(False),
                            write_through=mode == "w")

  def _status(self, timeout):
    """Reads the zygote's report of the child's end within timeout seconds (None: forever)."""
    if self.returncode is not None:
      return self.returncode
    ready, _, _ = select.select([self._connection], [], [], timeout)
    if not ready:
      return None
    message = self._connection.recv(1 << 16)
    self._connection.close()
    if not message:  # the zygote is gone: report it as a kill, as for a lost child
      self.returncode = -signal.SIGKILL
      return self.returncode
    status = json.loads(message)
    self.returncode = status["returncode"]
    timings.count_program_cpu(status["cpu"])
    self._zygote.children_cpu += status["cpu"]
    return self.returncode

  def poll(self):
    return self._status(0)

  def wait(self, timeout=None):
    if self._status(timeout) is None:
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, input=None, timeout=None):  # pylint: disable=redefined-builtin
    """Reads stdout and stderr to their ends (threads, so neither pipe fills) and waits."""
    if input is not None and self.stdin is not None:
      self.stdin.write(input)
    if self.stdin is not None:
      self.stdin.close()
    results = {}

    def read(name, stream):
      results[name] = stream.read()

    readers = [threading.Thread(target=read, args=(name, stream), daemon=True)
               for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
               if stream is not None]
    deadline = None if timeout is None else time.monotonic() + timeout
    for reader in readers:
      reader.start()
    for reader in readers:
      reader.join(None if deadline is None else max(0, deadline - time.monotonic()))
      if reader.is_alive():
        raise subprocess.TimeoutExpired(self.args, timeout)
    self.wait(None if deadline is None else max(0, deadline - time.monotonic()))
    for stream in (self.stdout, self.stderr):
      if stream is not None:
        stream.close()
    return results.get("stdout"), results.get("stderr")

  def send_signal(self, sig):
    if self.returncode is None:
      os.kill(self.pid, sig)

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for stream in (self.stdin, self.stdout, self.stderr):
      if stream is not None:
        stream.close()
    self.wait()


def start(args, *, fresh=False, **kwargs):
  """subprocess.Popen(args, **kwargs), forked from a zygote unless fresh or not forkable."""
  if fresh or not _forkable(args):
    return subprocess.Popen(args, **kwargs)
  timings.count_program(args)
  return Popen(args, **kwargs)


def run(args, *, fresh=False, capture_output=False, timeout=None, check=False, input=None,  # pylint: disable=redefined-builtin
        **kwargs):
  """subprocess.run(args, ...), forked from a zygote unless fresh or not forkable."""
  if fresh or not _forkable(args):
    return subprocess.run(args, capture_output=capture_output, timeout=timeout, check=check,
                          input=input, **kwargs)
  if capture_output:
    kwargs["stdout"] = kwargs["stderr"] = PIPE
  if input is not None:
    kwargs["stdin"] = PIPE
  process = start(args, **kwargs)
  try:
    stdout, stderr = process.communicate(input, timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    raise
  done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
  if check:
    done.check_returncode()
  return done


# --- the zygote --------------------------------------------------------------------------------


def _preload():
  """Imports PRELOAD; returns what each child does before its program (None: nothing).

  Where the TPU build runs with libtpu unloaded, estimator_tpu settles it as
  TensorFlow loads: a device listing (its 4-second TPU platform search) and a
  one-op graph run (whose one-time log it keeps off stderr). That run starts
  TensorFlow's process-wide thread pools, which a forked child does not have:
  its first Session would wait on them forever. Here the zygote lists the
  devices only and each child makes the run, as the program's own start-up
  would, before its program.
  """
  from estimator_tpu import libtpu_guard  # pylint: disable=import-outside-toplevel
  from estimator_tpu import tf_startup  # pylint: disable=import-outside-toplevel
  if not libtpu_guard.runs_without_tpu():
    for module in PRELOAD:
      __import__(module)
    return None
  settle_tpu_build, loaded = tf_startup._settle_tpu_build, []  # pylint: disable=protected-access

  def list_devices_only(tf):
    tf.config.list_physical_devices()
    loaded.append(tf)

  tf_startup._settle_tpu_build = list_devices_only  # pylint: disable=protected-access
  try:
    for module in PRELOAD:
      __import__(module)
  finally:
    tf_startup._settle_tpu_build = settle_tpu_build  # pylint: disable=protected-access
  if not loaded:  # not through estimator_tpu's start-up hook (ESTIMATOR_TPU_TF_STARTUP_LOGS=1)
    return None

  def settle():
    with tf_startup.captured():
      settle_tpu_build(loaded[0])

  return settle


def _serve(address):
  """Loads PRELOAD and PRELOAD_IF_INSTALLED, then forks a child per request.

  Returns (request, fds, settle) in the child: settle is _preload's.
  """
  started = dict(os.environ)
  settle = _preload()
  for module in PRELOAD_IF_INSTALLED:
    with contextlib.suppress(ImportError):
      __import__(module)
  # What loading added to the environment (TF_USE_LEGACY_KERAS, the TPU build's guard): a fresh
  # program's own imports would add it to whatever environment it was given.
  added = {name: value for name, value in os.environ.items() if name not in started}
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(address)
  listener.listen(64)
  me = resource.getrusage(resource.RUSAGE_SELF)
  sys.stdout.write(f"ready {me.ru_utime + me.ru_stime:.3f}\n")
  sys.stdout.flush()
  waiting = {}  # pid -> the connection its status goes back on
  while True:
    ready, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
    if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1024):
      for pid in waiting:
        with contextlib.suppress(OSError):
          os.kill(pid, signal.SIGKILL)
      os._exit(0)  # pylint: disable=protected-access
    if listener in ready:
      connection, _ = listener.accept()
      message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
      request = json.loads(message)
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        for other in (listener, connection, *waiting.values()):
          other.close()
        request["env"] = {**added, **request["env"]}
        return request, fds, settle
      for fd in fds:
        os.close(fd)
      connection.send(json.dumps({"pid": pid}).encode())
      waiting[pid] = connection
    while waiting:
      pid, status, usage = os.wait4(-1, os.WNOHANG)
      if pid == 0:
        break
      connection = waiting.pop(pid)
      with contextlib.suppress(OSError):
        connection.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status),
                                    "cpu": usage.ru_utime + usage.ru_stime}).encode())
      connection.close()


def _become(request, fds, settle):
  """In the forked child: takes the request's descriptors, place and environment; runs it."""
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  for fd in set(fds):
    if fd > 2:
      os.close(fd)
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  if settle is not None:
    settle()
  if "numpy" in sys.modules:  # a fresh process draws its own global NumPy state
    sys.modules["numpy"].random.seed()
  import runpy  # pylint: disable=import-outside-toplevel
  argv = request["argv"]
  if argv[0] == "-m":
    sys.argv = ["-m", *argv[2:]]
    sys.path[0] = os.getcwd()
    runpy._run_module_as_main(argv[1])  # pylint: disable=protected-access
  elif argv[0] == "-c":
    sys.argv = ["-c", *argv[2:]]
    sys.path[0] = ""
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
  else:
    script = os.path.abspath(argv[0])  # __file__ is absolute, as Python makes it
    sys.path[0] = os.path.dirname(script)
    sys.argv = list(argv)
    runpy.run_path(script, run_name="__main__")


def _exit_code(request, fds, settle):
  """Runs the request as Python runs a program; returns the status Python would exit with."""
  try:
    _become(request, fds, settle)
  except SystemExit as stop:
    if stop.code is None or isinstance(stop.code, int):
      return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    sys.excepthook(*sys.exc_info())
    return -signal.SIGINT
  except BaseException:  # pylint: disable=broad-exception-caught
    sys.excepthook(*sys.exc_info())
    return 1
  return 0


def _end(code):
  """Ends the child as Python ends: non-daemon threads joined, atexit run, streams flushed.

  The interpreter's teardown of every module (over a second with TensorFlow
  loaded, most of it copying the zygote's pages) is left out: what a program
  leaves only to that teardown is lost here, never gained.
  """
  import atexit as exits  # pylint: disable=import-outside-toplevel
  threading._shutdown()  # pylint: disable=protected-access
  exits._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  if code == -signal.SIGINT:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  os._exit(code & 0xFF)  # pylint: disable=protected-access


if __name__ == "__main__":
  _end(_exit_code(*_serve(sys.argv[1])))
