"""A real `vllm serve` (vLLM's OpenAI-compatible server) started and stopped by the profiler.

The server runs from vLLM's own virtual environment (scripts/setup-vllm-cpu.sh) on 127.0.0.1, in a
process group of its own, so stopping it stops its engine-core and helper processes too. It is
stopped on every path out of the `with` block: a normal end, an error, Ctrl-C. Its log is kept.

vLLM's CPU build runs here with the settings that worked on this machine class: a fixed KV cache
(`VLLM_CPU_KVCACHE_SPACE`, GiB), OpenMP threads unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`; the
VM's cores are not the host's), Intel's OpenMP runtime preloaded from the venv, and eager mode
(`--enforce-eager`: no graph capture to warm up).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError

HOST = "127.0.0.1"
SERVED_NAME = "model"


@dataclass(frozen=True)
class ServerConfig:
    model: Path                      # a Hugging Face folder (config.json, safetensors, tokenizer)
    venv: Path = Path(".vllm-venv")  # vLLM's virtual environment
    port: int = 8391
    dtype: str = "float32"           # vLLM's --dtype
    max_model_len: int = 2048
    threads: int = 2
    kv_cache_gib: int = 2
    seed: int = 0
    speculative: dict | None = None  # vLLM's --speculative-config, None: no speculation
    start_timeout_s: float = 300.0
    log: Path | None = None          # where the server's output goes (default: a temporary file)

    def command(self) -> list[str]:
        cmd = [str(self.venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model), "--served-model-name", SERVED_NAME, "--host", HOST,
               "--port", str(self.port), "--max-model-len", str(self.max_model_len), "--enforce-eager",
               "--dtype", self.dtype, "--seed", str(self.seed), "--disable-uvicorn-access-log"]
        if self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        return cmd

    def environment(self) -> dict:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": str(self.threads), "VLLM_LOGGING_LEVEL": "INFO"}
        iomp = self.venv / "lib" / "libiomp5.so"
        if iomp.exists():
            env["LD_PRELOAD"] = str(iomp.resolve())
        return env


def vllm_version(venv: Path) -> str:
    """vLLM's version in `venv`, read from its package metadata (the CPU build is named vllm-cpu)."""
    python = venv / "bin" / "python"
    script = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    try:
        out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def check_server_config(config: ServerConfig) -> None:
    """Bad input, before anything starts: one line naming what is wrong."""
    if not (config.venv / "bin" / "python").exists():
        raise InputError("--venv", f"{config.venv} is not a virtual environment with vLLM; "
                                   f"run scripts/setup-vllm-cpu.sh {config.venv}")
    if not (config.model / "config.json").is_file():
        raise InputError("--model", f"{config.model} is not a Hugging Face model folder (no config.json); "
                                    f"python -m profiler export-hf writes one")
    if not list(config.model.glob("*.safetensors")):
        raise InputError("--model", f"{config.model} has no .safetensors weights")
    if port_in_use(config.port):
        raise InputError("--port", f"{HOST}:{config.port} is in use")


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


class VllmServer:
    """`with VllmServer(config) as server:` a healthy server at server.url, stopped on exit."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.url = f"http://{HOST}:{config.port}"
        self.process: subprocess.Popen | None = None
        self.log_path = config.log
        self.started_s = 0.0

    def __enter__(self) -> "VllmServer":
        check_server_config(self.config)
        if self.log_path is None:
            import tempfile

            handle, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with self.log_path.open("w") as log:
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
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise InputError("--model", f"vLLM's server exited while starting ({self.last_log_line()}); "
                                            f"log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise InputError("--model", f"vLLM's server was not healthy within {self.config.start_timeout_s:.0f} s; "
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
