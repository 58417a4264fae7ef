"""llama.cpp's `llama-server` (scripts/build-llama-server.sh builds it from the llama.cpp sources in
the llama-cpp-python source package), serving a GGUF model file directly.

`--parallel` slots decode together in one batch (continuous batching); each slot holds
`max_model_len` tokens of context (`--no-kv-unified`, `-c` = slots x max_model_len). Speculation is
llama.cpp's own n-gram drafter, `--spec-type ngram-simple`: the last `size_n` tokens (the sampled one
included) looked up in the request's history, the `size_m` tokens after the latest earlier match
proposed. `--metrics` serves the speculative counters (drafts, draft tokens, accepted, accepted per
position) under the same names as vLLM's, prefixed `llamacpp:`.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from profiler.serve.client import LLAMA_COMPLETION
from profiler.serve.server import HOST, SERVED_NAME, check_port
from sim.errors import InputError

DEFAULT_BINARY = Path(".llama-server/bin/llama-server")
# GGUF general.file_type -> the weights' dtype as a run records it (llama.cpp's llama_ftype).
FILE_TYPES = {0: "float32", 1: "float16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 15: "q4_k_m",
              17: "q5_k_m", 18: "q6_k", 32: "bfloat16"}


@dataclass(frozen=True)
class LlamaServerConfig:
    model: Path                          # a GGUF file
    binary: Path = DEFAULT_BINARY
    port: int = 8391
    parallel: int = 1                    # slots: requests decoded together
    max_model_len: int = 2048            # context per slot
    threads: int = 2
    seed: int = 0
    speculative: dict | None = None      # {"size_n": N, "size_m": M} for ngram-simple, None: no speculation
    extra_args: tuple[str, ...] = ()     # appended to the command line as given (serve-live --server-arg)
    start_timeout_s: float = 120.0
    log: Path | None = None

    label = "llama-server"
    engine = "llama.cpp"
    api = LLAMA_COMPLETION
    metrics_prefix = "llamacpp:spec_decode_"

    def command(self) -> list[str]:
        cmd = [str(self.binary), "--model", str(self.model), "--alias", SERVED_NAME, "--host", HOST,
               "--port", str(self.port), "--parallel", str(self.parallel), "--no-kv-unified",
               "--ctx-size", str(self.parallel * self.max_model_len), "--threads", str(self.threads),
               "--threads-batch", str(self.threads), "--seed", str(self.seed), "--metrics", "--no-webui"]
        if self.speculative is not None:
            cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.speculative["size_n"]),
                    "--spec-ngram-simple-size-m", str(self.speculative["size_m"])]
        return cmd + list(self.extra_args)

    def environment(self) -> dict:
        return dict(os.environ)

    def check(self) -> None:
        """Bad input, before anything starts: one line naming what is wrong."""
        if not (self.binary.is_file() and os.access(self.binary, os.X_OK)):
            raise InputError("--server-bin", f"{self.binary} is not a llama-server binary; "
                                             f"run scripts/build-llama-server.sh")
        check_gguf(self.model)
        if self.speculative is not None and self.speculative["size_n"] > self.speculative["size_m"]:
            # ngram-simple never drafts fewer tokens than it looks up (common/ngram-map.cpp).
            raise InputError("--prompt-lookup-min", f"llama.cpp's ngram-simple looks up {self.speculative['size_n']} "
                                                    f"tokens and drafts only where k >= that (k {self.speculative['size_m']})")
        check_port(self.port)

    def version(self) -> str:
        """`llama-server --version`'s first line ("version: 1 (abc123)")."""
        try:
            out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        lines = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.startswith("version")]
        return lines[0].removeprefix("version:").strip() if lines else "unknown"


def check_gguf(path: Path) -> None:
    if not path.is_file():
        raise InputError("--model", f"{path} is not a GGUF file")
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise InputError("--model", f"{path} is not a GGUF file (no GGUF magic)")


def gguf_model(path: Path) -> tuple[object, object, str, str]:
    """The GGUF file's tokenizer, shape (LlamaConfig), weights' dtype and content hash."""
    from profiler.engine.gguf_loader import ModelLoadError, read_config, read_gguf, sha256_prefix
    from profiler.engine.tokenizer import tokenizer_from_gguf

    check_gguf(path)
    try:
        reader = read_gguf(path)
        shape = read_config(reader)
        tok = tokenizer_from_gguf(reader)
    except (ModelLoadError, ValueError, KeyError) as exc:
        raise InputError("--model", f"{path}: {exc}") from None
    field = reader.get_field("general.file_type")
    file_type = int(field.parts[field.data[0]][0]) if field is not None else -1
    return tok, shape, FILE_TYPES.get(file_type, f"gguf-file-type-{file_type}"), sha256_prefix(path)


def ngram_simple(k: int, lookup: int = 2) -> dict:
    """llama.cpp's ngram-simple drafting k tokens after a match of the last `lookup` tokens."""
    return {"size_n": lookup, "size_m": k}
