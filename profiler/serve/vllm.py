"""vLLM's OpenAI-compatible server (`vllm serve`), run from vLLM's own virtual environment
(scripts/setup-vllm-cpu.sh) on a Hugging Face model folder (`python -m profiler export-hf`).

vLLM's CPU build runs here with the settings that worked on this machine class: a fixed KV cache
(`VLLM_CPU_KVCACHE_SPACE`, GiB), OpenMP threads unbound (`VLLM_CPU_OMP_THREADS_BIND=nobind`; the
VM's cores are not the host's), Intel's OpenMP runtime preloaded from the venv, and eager mode
(`--enforce-eager`: no graph capture to warm up).
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from profiler.serve.client import OPENAI_COMPLETIONS
from profiler.serve.server import HOST, SERVED_NAME, check_port
from sim.errors import InputError

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class VllmServerConfig:
    model: Path                      # a Hugging Face folder (config.json, safetensors, tokenizer)
    venv: Path = Path(".vllm-venv")  # vLLM's virtual environment
    port: int = 8391
    dtype: str = "float32"           # vLLM's --dtype
    max_model_len: int = 2048
    threads: int = 2
    kv_cache_gib: int = 2
    seed: int = 0
    speculative: dict | None = None  # vLLM's --speculative-config, None: no speculation
    extra_args: tuple[str, ...] = ()     # appended to the command line as given (serve-live --server-arg)
    start_timeout_s: float = 300.0
    log: Path | None = None          # where the server's output goes (default: a temporary file)

    label = "vLLM's server"
    engine = "vllm"
    api = OPENAI_COMPLETIONS
    metrics_prefix = "vllm:spec_decode_"

    def command(self) -> list[str]:
        cmd = [str(self.venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model), "--served-model-name", SERVED_NAME, "--host", HOST,
               "--port", str(self.port), "--max-model-len", str(self.max_model_len), "--enforce-eager",
               "--dtype", self.dtype, "--seed", str(self.seed), "--disable-uvicorn-access-log"]
        if self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               "OMP_NUM_THREADS": str(self.threads), "VLLM_LOGGING_LEVEL": "INFO"}
        iomp = self.venv / "lib" / "libiomp5.so"
        if iomp.exists():
            env["LD_PRELOAD"] = str(iomp.resolve())
        return env

    def check(self) -> None:
        """Bad input, before anything starts: one line naming what is wrong."""
        if not (self.venv / "bin" / "python").exists():
            raise InputError("--venv", f"{self.venv} is not a virtual environment with vLLM; "
                                       f"run scripts/setup-vllm-cpu.sh {self.venv}")
        if not (self.model / "config.json").is_file():
            raise InputError("--model", f"{self.model} is not a Hugging Face model folder (no config.json); "
                                        f"python -m profiler export-hf writes one")
        if not list(self.model.glob("*.safetensors")):
            raise InputError("--model", f"{self.model} has no .safetensors weights")
        if self.speculative is not None and self.speculative["method"] == "eagle":
            head = Path(self.speculative["model"])
            if not (head / "config.json").is_file() or not list(head.glob("*.safetensors")):
                raise InputError("--head", f"{head} is not an EAGLE checkpoint folder (config.json and .safetensors; "
                                           f"python -m profiler export-hf --head HEAD --out DIR writes one)")
        check_port(self.port)

    def version(self) -> str:
        """vLLM's version in the venv, read from its package metadata (the CPU build is named vllm-cpu)."""
        python = self.venv / "bin" / "python"
        script = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
        try:
            out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        return out.stdout.strip() or "unknown"


def ngram_config(k: int, lookup_min: int = 2, lookup_max: int = 4) -> dict:
    """vLLM's --speculative-config for prompt lookup (n-gram) drafting k tokens."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lookup_min,
            "prompt_lookup_max": lookup_max}


def eagle_config(head: Path, k: int) -> dict:
    """vLLM's --speculative-config for an EAGLE-1 head (a checkpoint folder) drafting chains of k."""
    return {"method": "eagle", "model": str(head), "num_speculative_tokens": k}
