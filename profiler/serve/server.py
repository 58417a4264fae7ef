"""A real engine's server started and stopped by the profiler: vLLM's `vllm serve`
(profiler/serve/vllm.py) or llama.cpp's `llama-server` (profiler/serve/llama_cpp.py).

The server runs on 127.0.0.1 in a process group of its own, so stopping it stops its engine-core and
helper processes too. It is stopped on every path out of the `with` block: a normal end, an error,
Ctrl-C. Its log is kept. An engine's config says how to start it (`command()`, `environment()`),
what is wrong before it starts (`check()`), and how a client talks to it (`api`, `metrics_prefix`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from profiler.serve.client import CompletionApi
from sim.errors import InputError

HOST = "127.0.0.1"
SERVED_NAME = "model"


class EngineServerConfig(Protocol):
    label: str                       # the server's name in messages ("vLLM's server")
    engine: str                      # the run folder's engine ("vllm", "llama.cpp")
    api: CompletionApi               # how requests are sent and streamed chunks read
    metrics_prefix: str              # its speculative counters' prefix on /metrics
    port: int
    start_timeout_s: float
    log: Path | None

    def command(self) -> list[str]: ...
    def environment(self) -> dict: ...
    def check(self) -> None: ...
    def version(self) -> str: ...


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise InputError("--port", f"must be a TCP port (got {port})")
    if port_in_use(port):
        raise InputError("--port", f"{HOST}:{port} is in use")


class ServerProcess:
    """`with ServerProcess(config) as server:` a healthy server at server.url, stopped on exit."""

    def __init__(self, config: EngineServerConfig):
        self.config = config
        self.url = f"http://{HOST}:{config.port}"
        self.process: subprocess.Popen | None = None
        self.log_path = config.log
        self.started_s = 0.0

    def __enter__(self) -> "ServerProcess":
        self.config.check()
        if self.log_path is None:
            import tempfile

            handle, name = tempfile.mkstemp(prefix="engine-server-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        # Appended: a log may hold several starts of one engine (interleaved runs).
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(self.config.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.config.environment(),
                                            start_new_session=True, preexec_fn=_die_with_parent)
        try:
            self.await_health()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def await_health(self) -> None:
        label = self.config.label
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise InputError("--model", f"{label} exited while starting ({self.last_log_line()}); "
                                            f"log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise InputError("--model", f"{label} was not healthy within {self.config.start_timeout_s:.0f} s; "
                                    f"log: {self.log_path}")

    def last_log_line(self) -> str:
        """The last error-looking line of the log (else its last line), for a one-line message."""
        lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line]
        return (errors or lines or ["no output"])[-1][-300:]

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (the server, its engine core and helpers), SIGKILL
        to whatever is left of the group after `grace_s`, also when interrupted while waiting."""
        process, self.process = self.process, None
        if process is None:
            return
        group = process.pid          # start_new_session: the server leads its own group
        try:
            _signal_group(group, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _group_alive(group) and time.monotonic() < deadline:
                process.poll()           # reap the leader so the group can empty
                time.sleep(0.2)
        finally:
            _signal_group(group, signal.SIGKILL)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _die_with_parent() -> None:
    """In the server's process before exec: Linux sends it SIGTERM if the profiler dies without
    stopping it (killed, or its terminal closed)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
