"""Time spec_kernels.attention (decode, chain, tree, partial KV) against the KV bytes it must read.

    python benchmarks/bench_kernels.py [--quick] [--out FILE.json]

On CUDA: the Triton kernel in bf16, timed with triton.testing.do_bench (median of its repeats),
beside torch's scaled_dot_product_attention on the same full context, and the achieved
bandwidth (KV bytes read / time) against a device-to-device copy measured in the same run. On the
CPU: the torch reference in fp32 with torch.utils.benchmark, at smaller sizes (the interpreter is
for correctness, not speed). Prints one JSON object (and writes it with --out).
"""
from __future__ import annotations

import argparse
import json
import platform

import torch


def copy_bandwidth_gb_s(device: str) -> float:
    """Bytes read + written per second by a large device copy (the ceiling for a streaming read)."""
    n = (1 << 28) if device == "cuda" else (1 << 25)
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = time_call(lambda: dst.copy_(src), device)
    return 2 * src.numel() * 4 / seconds / 1e9


def time_call(fn, device: str) -> float:
    """Median seconds of fn()."""
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    from torch.utils.benchmark import Timer

    return Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.3).median


def tree_mask(Q: int, width: int) -> torch.Tensor:
    """Root + `width` chains sharing it: [Q, Q] bool."""
    depth = (Q - 1) // width
    mask = torch.eye(Q, dtype=torch.bool)
    mask[:, 0] = True
    for node in range(1, Q):
        branch, level = (node - 1) // depth, (node - 1) % depth
        mask[node, 1 + branch * depth:1 + branch * depth + level + 1] = True
    return mask


def main() -> None:
    import spec_kernels

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    heads, kv_heads, D = 32, 8, 128                     # Llama-3.1-8B's attention
    if device == "cuda":
        contexts = [1024, 8192, 32768] if not args.quick else [8192]
        batches = [1, 8, 32] if not args.quick else [8]
    else:
        contexts, batches = [512, 2048], [1, 4]
    cases = [("decode", 1, None), ("chain k=4", 5, None), ("tree 4x4", 17, 4)]
    bandwidth = copy_bandwidth_gb_s(device)
    rows = []
    for B in batches:
        for context in contexts:
            k = torch.randn(B, kv_heads, context + 32, D, device=device, dtype=dtype)
            v = torch.randn_like(k)
            for label, Q, width in cases:
                q = torch.randn(B, heads, Q, D, device=device, dtype=dtype)
                kv_lens = torch.full((B,), context, dtype=torch.int32, device=device)
                mask = tree_mask(Q, width).expand(B, Q, Q).to(device) if width else None
                seconds = time_call(lambda: spec_kernels.attention(q, k, v, kv_lens, tree_mask=mask), device)
                kv_bytes = 2 * B * kv_heads * context * D * k.element_size()
                row = {"case": label, "batch": B, "context": context, "query_tokens": Q, "us": seconds * 1e6,
                       "kv_gb_s": kv_bytes / seconds / 1e9}
                if device == "cuda" and width is None:
                    causal = torch.ones(Q, context, dtype=torch.bool, device=device).tril(context - Q)
                    sdpa = time_call(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k[:, :, :context], v[:, :, :context], attn_mask=causal, enable_gqa=True), device)
                    row["sdpa_us"] = sdpa * 1e6
                rows.append(row)
            # SpecPV partial verification: sink 32 + budget + window 128 per KV head.
            for budget in (256, 1024):
                if 32 + budget + 128 >= context:
                    continue
                q = torch.randn(B, heads, 5, D, device=device, dtype=dtype)
                kv_lens = torch.full((B,), context, dtype=torch.int32, device=device)
                k_max, k_min = spec_kernels.block_summaries(k, kv_lens - 5, 16)
                index, lens = spec_kernels.select_blocks(q, k_max, k_min, budget // 16, sink_tokens=32, window_tokens=128,
                                                    kv_lens=kv_lens)
                seconds = time_call(lambda: spec_kernels.attention(q, k, v, kv_lens, kv_index=index, kv_index_lens=lens),
                                    device)
                select = time_call(lambda: spec_kernels.select_blocks(q, k_max, k_min, budget // 16, sink_tokens=32,
                                                                 window_tokens=128, kv_lens=kv_lens), device)
                rows.append({"case": f"partial {budget}, chain k=4", "batch": B, "context": context, "query_tokens": 5,
                             "us": seconds * 1e6, "selection_us": select * 1e6,
                             "kv_gb_s": 2 * B * kv_heads * int(lens.max()) * D * k.element_size() / seconds / 1e9})
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
              "copy_gb_s": bandwidth, "heads": heads, "kv_heads": kv_heads, "head_dim": D, "rows": rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
