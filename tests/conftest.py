import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The data the studies among the tests read: ../shared/data beside the checkout (CI's), or the folder
# SPECSIM_DATA names, holding Spec-Bench's questions and Pride and Prejudice. A test that needs them
# skips without them, every one with the same reason.
SHARED_DATA = Path(os.environ.get("SPECSIM_DATA") or REPO.parent / "shared" / "data")
TEXT = SHARED_DATA / "pride_and_prejudice.txt"
QUESTIONS = SHARED_DATA / "spec_bench_questions.jsonl"
DATA_MISSING = (f"needs the data folder {SHARED_DATA} (spec_bench_questions.jsonl, pride_and_prejudice.txt): "
                f"set SPECSIM_DATA to a folder holding them")
needs_data = pytest.mark.skipif(not (TEXT.is_file() and QUESTIONS.is_file()), reason=DATA_MISSING)

# Under pytest-xdist (pyproject.toml: two workers, whole files each) every worker's torch and the
# processes it starts get one thread: the suite is mostly one-threaded Python, and two workers of
# two threads each on two cores oversubscribe OpenMP (docs/performance.md, "The test suite").
# THREADS: what a test gives a server or a subprocess it starts. llama.cpp's threads spin while they
# wait: two of them beside the other worker took a 10 s test to 300 s.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
# The slowest files (their tests and fixtures, one worker each: docs/performance.md), handed out
# first so that neither worker is left running one of them alone at the end.
SLOWEST_FILES = ("test_gpu_check.py", "profiler/test_serve.py", "profiler/test_speculative_more.py",
                 "profiler/test_serving.py", "profiler/test_speculative.py", "sim/test_validation.py",
                 "sim/test_report_browser.py", "profiler/test_sampling.py", "profiler/test_calibration.py",
                 "profiler/test_live_cli.py", "profiler/test_blackbox_transformers.py", "test_benchmarks.py",
                 "test_docs.py")


def pytest_collection_modifyitems(config, items):
    """The slowest files first, in SLOWEST_FILES' order; the others after them as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    tests = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(rank)))

# The kernel tests run Triton for real on a GPU and through its CPU interpreter elsewhere; the
# interpreter must be chosen before triton is first imported.
try:
    import torch

    KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
except ImportError:
    KERNEL_DEVICE = "cpu"
if KERNEL_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")


def small_kernel_model(seed: int = 0, layers: int = 2, max_context: int = 512, heads: int = 4):
    """A small random Llama on KERNEL_DEVICE (weights N(0, 0.3), norms 1) whose greedy choices are
    decisive: the kernel path and the torch path give it the same tokens."""
    torch.manual_seed(seed)
    from profiler.engine.model import Llama, LlamaConfig

    model = Llama(LlamaConfig(name="small", layers=layers, hidden=heads * 16, heads=heads, kv_heads=2, head_dim=16,
                              ffn=128, vocab=97, tied_embeddings=True, max_context=max_context))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3) if "norm" not in name else p.fill_(1.0)
    return model.eval().to(KERNEL_DEVICE)


@pytest.fixture
def tiny_config(tmp_path) -> Path:
    """A one-layer Llama config small enough to price by hand."""
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "hidden_size": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "intermediate_size": 8,
        "vocab_size": 10, "tie_word_embeddings": True, "max_position_embeddings": 4096}))
    return path


# A machine whose roofline is easy to do by hand: 1e12 FLOP/s, 1e9 B/s, no overheads.
# vLLM's preset as it stood before issue 57 re-sourced its host work and drafting floor (350 us a
# step, no floor): tests of mechanisms that pin results or compare magnitudes use it, so a preset
# re-sourced from a new measurement does not move them.
VLLM_BEFORE_57 = {"preset": "vllm", "step_overhead_s": 350e-6, "draft_forward_overhead_s": 0.0}
UNIT_HARDWARE = {"memory_gb": 100, "hbm_gb_s": 1, "bf16_tflops": 1, "fp16_tflops": 1,
                 "fp32_tflops": 1, "pcie_gen": 4, "pcie_lanes": 16, "interconnect_gb_s": 1,
                 "interconnect": "test", "link_gb_s": 0.5}
UNIT_ENGINE = {"preset": "vllm", "mem_efficiency": 1.0, "compute_efficiency": 1.0, "step_overhead_s": 0.0,
               "request_overhead_s": 0.0, "forward_overhead_s": 0.0, "layer_overhead_s": 0.0,
               "ngram_lookup_s": 0.0, "link_efficiency": 1.0}


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct in fp32 and its tokenizer, loaded once for the session."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from profiler.engine.gguf_loader import load_gguf, read_gguf, smollm2_path
    from profiler.engine.tokenizer import tokenizer_from_gguf

    loaded = load_gguf(smollm2_path())
    return loaded.model, tokenizer_from_gguf(read_gguf(loaded.path))


def spec_bench_rows() -> list[dict]:
    """The Spec-Bench questions of the data folder (the test skips without them)."""
    if not QUESTIONS.is_file():
        pytest.skip(DATA_MISSING)
    return [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]


def small_draft(model, layers: int):
    """A draft model cut from the target: a copy of its first `layers` layers."""
    import copy

    draft = copy.deepcopy(model)
    draft.layers = draft.layers[:layers]
    return draft


# scripts/gpu-check.sh's dry run on the CPU: SmolLM2's shape with random weights; batch 1 in the first
# live part, batch 2 in the rest, two synthetic settings, SpecPV at 768 tokens; a budgeted calibration
# of the operators a whole forward is composed of (profiler.calibrate.run.FORWARD_OPERATORS), which
# tests/test_gpu_check.py checks as `--budget-s`'s end to end too: one 45 s calibration serves both.
FORWARD_OPERATORS = "linear.qkv,linear.o,linear.gate_up,linear.down,elementwise,attention,attention_prefill,lm_head"
DRY_RUN = {"DEVICE": "cpu", "DTYPE": "fp32", "MODEL": "smollm2-135m", "BATCHES": "1 2", "CORE_BATCHES": "1", "KS": "3",
           "ACCEPTANCES": "0.8 0.6", "CONTEXT": "128", "NEW_TOKENS": "12", "SPECPV_CONTEXT": "768",
           "SPECPV_BUDGET": "256", "CAL_BUDGET_S": "45", "CAL_OPERATORS": FORWARD_OPERATORS, "CAL_TIMEOUT": "120",
           "LIVE_TIMEOUT": "240",
           "REST_TIMEOUT": "240", "SPECPV_TIMEOUT": "240", "VALIDATE_TIMEOUT": "120",
           "PARTS": "live calibrate live-rest specpv validate"}


def run_gpu_check(out: Path, **settings) -> str:
    """scripts/gpu-check.sh at the dry run's settings (and `settings`), its files under `out`."""
    env = {**os.environ, **DRY_RUN, **settings, "OUT": str(out), "TRITON_INTERPRET": "1"}
    done = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="session")
def gpu_check_dry_run(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    out = tmp_path_factory.mktemp("gpu-check")
    run_gpu_check(out)
    return out
