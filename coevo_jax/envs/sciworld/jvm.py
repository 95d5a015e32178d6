"""One ScienceWorld simulator JVM: launched with a bounded heap, called with deadlines, killed without leftovers.

ScienceWorld (PyPI `scienceworld`) is Scala behind a py4j gateway. The package's `ScienceWorldEnv` starts its
JVM with no way to pass JVM options and waits on every call without a deadline, so this module starts
`py4j.GatewayServer` itself (`java -Xmx<heap> -XX:+UseSerialGC ... -cp py4j.jar:scienceworld.jar
py4j.GatewayServer --die-on-broken-pipe 0`), reads the port it prints and drives the simulator's
`PythonInterface` object directly.

Memory: the package's JVM (default G1 collector, heap limit a quarter of RAM) grows to gigabytes over the
task types; `-XX:+UseSerialGC -Xmx384m` (the defaults here) keeps it to a few hundred MB, and a smaller heap
slows the steps.

Determinism: ScienceWorld iterates sets of objects in identity-hash order, so the same actions give different
observations (a thermometer reading, the order of things in a room) from one load to the next in the same
JVM. With `deterministic=True` the JVM gives every object the same identity hash (`-XX:hashCode=2`, a HotSpot
experimental option), which makes an episode a function of (task, variation, actions) alone, whatever the
JVM ran before, at the cost of slower steps. Restart-and-replay (`supervisor`) relies on it.

Calls: each call runs on this JVM's own daemon worker thread and is awaited with a deadline. No answer in time
raises `JVMTimeout` (a hung JVM); a dead process, a broken socket or a Java exception raise `JVMCrash`. The
caller then kills the JVM (a call stuck in a hung JVM is released by the kill); nothing here retries.

Cleanup: `kill()` SIGKILLs the process. A JVM still alive at interpreter exit is killed by a `weakref.finalize`
hook, and `--die-on-broken-pipe` makes the JVM exit by itself when this process dies without running hooks.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import subprocess
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

_ENTRY_POINT = "scienceworld.runtime.pythonapi.PythonInterface"
_OUTPUT_TAIL_LINES = 30


class JVMError(RuntimeError):
    """The JVM crashed, hung or raised; it must be killed and restarted before further use."""


class JVMCrash(JVMError):
    """The JVM could not start, died, or a call into it failed."""


class JVMTimeout(JVMError):
    """A call into the JVM got no answer before its deadline."""


@dataclass(frozen=True)
class JVMOptions:
    """How to start a ScienceWorld JVM."""

    max_heap: str = "384m"  # -Xmx
    deterministic: bool = True  # constant identity hash: reproducible episodes (see the module docstring)
    java: str = "java"
    start_timeout_s: float = 60.0
    extra_options: tuple[str, ...] = ()

    def command(self) -> list[str]:
        """The java command line that starts the gateway with ScienceWorld's jar on the class path."""
        from py4j.java_gateway import find_jar_path
        from scienceworld.constants import JAR_PATH

        options = [f"-Xmx{self.max_heap}", "-XX:+UseSerialGC"]
        if self.deterministic:
            options += ["-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2"]
        classpath = f"{find_jar_path()}:{JAR_PATH}"
        return [
            self.java,
            *options,
            *self.extra_options,
            "-cp",
            classpath,
            "py4j.GatewayServer",
            "--die-on-broken-pipe",
            "0",
        ]


def _drain(stream, port_box: queue.Queue, tail: collections.deque) -> None:
    """Reads the JVM's output (so it never blocks on a full pipe): the first all-digit line is the port."""
    reported = False
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if not reported and line.strip().isdigit():
            port_box.put(int(line))
            reported = True
        else:
            tail.append(line)
    if not reported:
        port_box.put(None)


def _serve(requests: queue.Queue) -> None:
    """The worker thread: runs (future, function) requests one at a time until it gets None."""
    while (item := requests.get()) is not None:
        future, function = item
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(function())
            except BaseException as error:  # handed to the caller, who decides
                future.set_exception(error)


def _kill_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log.error("ScienceWorld JVM pid %d did not exit 10 s after SIGKILL", process.pid)
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:
            pass


class ScienceWorldJVM:
    """A started ScienceWorld JVM; `call` invokes a method of its `PythonInterface` with a deadline."""

    def __init__(self, options: JVMOptions = JVMOptions()):
        from py4j.java_gateway import GatewayParameters, JavaGateway
        from scienceworld.constants import BASEPATH

        self.options = options
        command = options.command()
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=BASEPATH
            )
        except OSError as error:
            raise JVMCrash(
                f"cannot run {options.java!r} for ScienceWorld ({error}); it needs Java >= 11 "
                "(Debian/Ubuntu: apt-get install default-jre-headless)"
            ) from error
        self._finalizer = weakref.finalize(self, _kill_process, self._process)
        self._tail: collections.deque[str] = collections.deque(maxlen=_OUTPUT_TAIL_LINES)
        port_box: queue.Queue = queue.Queue()
        threading.Thread(
            target=_drain,
            args=(self._process.stdout, port_box, self._tail),
            daemon=True,
            name="sciworld-jvm-out",
        ).start()
        self._requests: queue.Queue = queue.Queue()
        threading.Thread(
            target=_serve, args=(self._requests,), daemon=True, name="sciworld-jvm-calls"
        ).start()
        self._killed = False
        try:
            port = port_box.get(timeout=options.start_timeout_s)
        except queue.Empty:
            self.kill()
            raise JVMTimeout(
                f"ScienceWorld JVM pid {self.pid} did not report its port within {options.start_timeout_s:g} s"
            ) from None
        if port is None:
            self.kill()
            raise JVMCrash(f"ScienceWorld JVM exited before starting: {self.output_tail()}")
        gateway = self._gateway = JavaGateway(
            gateway_parameters=GatewayParameters(port=port, auto_field=True)
        )

        def connect():  # name lookups on the JVM view are calls into the JVM too
            entry_point = gateway.jvm
            for part in _ENTRY_POINT.split("."):
                entry_point = getattr(entry_point, part)
            return entry_point()

        try:
            self._server = self._run("connect", connect, options.start_timeout_s)
        except JVMError:
            self.kill()
            raise
        log.info("ScienceWorld JVM pid %d on port %d (%s)", self.pid, port, " ".join(command[1:-5]))

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return not self._killed and self._process.poll() is None

    def rss_bytes(self) -> int | None:
        """Resident memory of the JVM process (Linux /proc), or None when it cannot be read."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def output_tail(self) -> str:
        """The JVM's last lines of output (stdout and stderr), for error messages."""
        return " | ".join(self._tail) or "(no output)"

    def call(self, method: str, *args, timeout_s: float):
        """`PythonInterface.method(*args)`; Java lists come back as Python lists."""
        from py4j.java_collections import JavaArray, JavaList

        def invoke():
            result = getattr(self._server, method)(*args)
            return list(result) if isinstance(result, JavaList | JavaArray) else result

        return self._run(method, invoke, timeout_s)

    def _run(self, what: str, function: Callable, timeout_s: float):
        from py4j.protocol import Py4JError

        if self._killed:
            raise JVMCrash(f"ScienceWorld JVM pid {self.pid} was killed; start a new one")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((future, function))
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise JVMTimeout(
                f"ScienceWorld JVM pid {self.pid}: {what} gave no answer in {timeout_s:g} s"
            ) from None
        except Py4JError as error:
            code = self._process.poll()
            state = "running" if code is None else f"exited with code {code}"
            first_line = (str(error).strip().splitlines() or [""])[0]
            raise JVMCrash(
                f"ScienceWorld JVM pid {self.pid} ({state}): {what} failed: {type(error).__name__}: {first_line}"
            ) from error

    def kill(self) -> None:
        """Kills the process and releases the gateway; safe to call twice."""
        if self._killed:
            return
        self._killed = True
        gateway = getattr(self, "_gateway", None)
        if gateway is not None:
            gateway._gateway_client.is_connected = False  # stray finalizers and calls fail fast, quietly
        self._finalizer()  # kills and reaps the process
        if gateway is not None:
            gateway.close()
        self._requests.put(None)
