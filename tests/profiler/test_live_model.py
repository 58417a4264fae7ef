"""The torch Llama decoder, its GGUF loader and tokenizer, on the real SmolLM2-135M and tiny models."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from profiler.engine.generate import generate, prefill_logits  # noqa: E402
from profiler.engine.gguf_loader import ModelLoadError, load_gguf  # noqa: E402
from profiler.engine.model import SMALL_QUERY, Llama, LlamaConfig, causal_mask  # noqa: E402

TINY = LlamaConfig(name="tiny", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, vocab=50,
                   tied_embeddings=False, max_context=128, rope_theta=10000.0)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    model = Llama(TINY)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


@torch.inference_mode()
def test_cached_decoding_matches_a_full_forward_at_every_position():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab, (1, 20))
    model.setup_cache(1, 64)
    full = model(tokens, torch.arange(20)[None])
    model.setup_cache(1, 64)
    model(tokens[:, :12], torch.arange(12)[None])
    for t in range(12, 20):
        step = model(tokens[:, t:t + 1], torch.tensor([[t]]))
        torch.testing.assert_close(step[0, -1], full[0, t], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_rows_at_different_positions_decode_as_if_alone():
    model = tiny_model(1)
    prompts = [[3, 7, 9, 11, 2], [5, 1], [8, 8, 8, 8, 8, 8, 8, 8]]
    together = generate(model, prompts, 12)
    alone = [generate(model, [p], 12)[0] for p in prompts]
    assert together == alone


@torch.inference_mode()
def test_ragged_long_prompts_prefill_as_if_alone_with_a_mask():
    # Prompts past SMALL_QUERY take SDPA's causal kernel with no mask; each row's logits and cache
    # must equal a masked forward of that prompt alone (padding never seen by a real query).
    model = tiny_model(2)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, TINY.vocab, (n,), generator=generator).tolist() for n in (100, SMALL_QUERY + 6, 90)]
    model.setup_cache(3, 128)
    together = prefill_logits(model, prompts)
    caches = [layer.attention.k_cache.clone() for layer in model.layers]
    for b, prompt in enumerate(prompts):
        model.setup_cache(1, 128)
        n = len(prompt)
        alone = model(torch.tensor([prompt]), torch.arange(n)[None], mask=causal_mask(torch.arange(n)[None], n))
        torch.testing.assert_close(together[b], alone[0, -1], rtol=1e-4, atol=1e-4)
        for layer, cache in zip(model.layers, caches):
            torch.testing.assert_close(cache[b, :, :n], layer.attention.k_cache[0, :, :n])


def test_causal_mask_sees_only_earlier_positions():
    mask = causal_mask(torch.tensor([[2, 3], [0, 1]]), 4)
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert mask[1, 0].tolist() == [[True, False, False, False], [True, True, False, False]]


def test_context_beyond_the_maximum_is_refused():
    with pytest.raises(ValueError, match="beyond the model's maximum 128"):
        tiny_model().setup_cache(1, 129)


def test_missing_model_file_is_one_line_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such model file"):
        load_gguf(tmp_path / "absent.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        load_gguf(bad)


def test_smollm2_config_comes_from_the_gguf_metadata(smollm2):
    model, _ = smollm2
    c = model.config
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab) == (30, 576, 9, 3, 64, 1536, 49152)
    assert c.tied_embeddings and c.max_context == 8192 and c.rope_theta == 100000.0
    assert model.lm_head.weight is model.embed.weight


def test_a_gguf_file_is_parsed_once_per_process_until_it_changes(smollm2, tmp_path):
    # The parse reads the whole vocabulary (about 4 s for SmolLM2): loading the model and then its
    # tokenizer share one; a file rewritten since is parsed again.
    import os

    import gguf

    from profiler.engine.gguf_loader import read_gguf, smollm2_path

    reader = read_gguf(smollm2_path())
    assert read_gguf(smollm2_path()) is reader
    os.symlink(smollm2_path(), tmp_path / "same.gguf")
    assert read_gguf(tmp_path / "same.gguf") is reader          # one file, another name

    def write(path, value):
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_uint32("test.value", value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    small = tmp_path / "small.gguf"
    write(small, 1)
    first = read_gguf(small)
    assert read_gguf(small) is first and int(first.get_field("test.value").parts[-1][0]) == 1
    write(small, 2)
    os.utime(small, ns=(1, small.stat().st_mtime_ns + 1_000_000_000))
    assert int(read_gguf(small).get_field("test.value").parts[-1][0]) == 2


def test_chat_special_tokens_are_single_ids(smollm2):
    _, tok = smollm2
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    ids = tok.encode_chat("Hello")
    assert ids[0] == 1 and tok.decode(ids, skip_special=False).startswith("<|im_start|>system\n")
    assert tok.decode(tok.encode("Speculative decoding, 2026!")) == "Speculative decoding, 2026!"


def test_smollm2_greedy_answers_are_sensible_english(smollm2):
    model, tok = smollm2
    questions = ["What is the capital of France?", "Name three primary colors."]
    outputs = generate(model, [tok.encode_chat(q) for q in questions], 24, tok.eos_id)
    answers = [tok.decode(o) for o in outputs]
    assert "Paris" in answers[0]
    assert sum(color in answers[1].lower() for color in ("red", "blue", "yellow", "green")) >= 2
    assert all(o[-1] == tok.eos_id for o in outputs)   # both finish their sentence


def test_long_context_prompts_have_the_exact_length_and_keep_the_chat_template(smollm2, tmp_path):
    from profiler.live.prompts import long_context_prompts

    _, tok = smollm2
    text = tmp_path / "book.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife. " * 200)
    prompts = long_context_prompts(tok, text, 700, 3)
    assert [len(p) for p in prompts] == [700, 700, 700]
    assert len({tuple(p) for p in prompts}) == 3                    # each request its own excerpt
    decoded = tok.decode(prompts[1], skip_special=False)
    assert "Summarize the following text" in decoded and decoded.endswith("<|im_start|>assistant\n")


def test_a_16_bit_models_logits_are_summed_and_returned_in_fp32_never_rounded_to_16_bits():
    # Rounded to bf16, the top logits of a large vocabulary tie often enough that another GEMM
    # tiling breaks a tie the other way (profiler.engine.model.fp32_logits).
    torch.manual_seed(0)
    config = LlamaConfig(name="wide", layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=4096,
                         tied_embeddings=False, max_context=64)
    model = Llama(config).to(torch.bfloat16).eval()
    hidden = torch.randn(2, 3, 64).to(torch.bfloat16)
    with torch.inference_mode():
        logits = model.logits(hidden)
    expected = model.norm(hidden).float() @ model.lm_head.weight.float().t()
    assert logits.dtype == torch.float32 and logits.shape == (2, 3, config.vocab)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert (logits != logits.to(torch.bfloat16).float()).float().mean() > 0.9      # off the bf16 grid
