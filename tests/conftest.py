import json
import os
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
    gguf = pytest.importorskip("gguf")
    from profiler.engine.gguf_loader import load_gguf, smollm2_path
    from profiler.engine.tokenizer import tokenizer_from_gguf

    loaded = load_gguf(smollm2_path())
    return loaded.model, tokenizer_from_gguf(gguf.GGUFReader(loaded.path))


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
