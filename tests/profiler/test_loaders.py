"""Model sources: a Hugging Face safetensors folder (checked against transformers itself), random
weights from a config.json or a preset, and name resolution."""
import json

import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from profiler.engine.gguf_loader import ModelLoadError, smollm2_path  # noqa: E402
from profiler.engine.loaders import resolve_model  # noqa: E402

TOKENS = torch.tensor([[1, 504, 3458, 282, 4909, 314, 216, 33, 34, 35]])


def logits_of(model, tokens=TOKENS):
    model.setup_cache(1, 32)
    with torch.inference_mode():
        return model(tokens, torch.arange(tokens.shape[1])[None])


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """SmolLM2 as transformers reads it from the GGUF, written as a Hugging Face folder, with
    transformers' own logits for TOKENS."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = smollm2_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32)
    with torch.inference_mode():
        expected = reference(TOKENS).logits
    folder = tmp_path_factory.mktemp("hf") / "smollm2-hf"
    folder.mkdir()
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k != "lm_head.weight"}   # tied
    safetensors_torch.save_file(state, folder / "model.safetensors")
    reference.config.to_json_file(folder / "config.json")
    gguf_model = resolve_model("smollm2")
    gguf_model.tokenizer.tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": gguf_model.tokenizer.chat_template}))
    return folder, expected, gguf_model


def test_our_llama_matches_transformers_on_smollm2(hf_folder):
    folder, expected, gguf_model = hf_folder
    ours = logits_of(gguf_model.model)
    assert (ours - expected).abs().max() < 1e-3 * expected.abs().max()
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))


def test_a_hugging_face_folder_loads_to_the_same_model_as_the_gguf(hf_folder):
    folder, expected, gguf_model = hf_folder
    loaded = resolve_model(str(folder))
    assert loaded.config.rope_theta == gguf_model.config.rope_theta == 100000.0
    assert loaded.config.tied_embeddings and loaded.source == "smollm2-hf"
    torch.testing.assert_close(logits_of(loaded.model), logits_of(gguf_model.model), rtol=0, atol=1e-5)
    prompt = "What is the capital of France?"
    assert loaded.tokenizer.encode_chat(prompt) == gguf_model.tokenizer.encode_chat(prompt)


def test_random_weights_follow_the_config_and_the_seed(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                                  "vocab_size": 50000, "max_position_embeddings": 256}))
    a, b, c = (resolve_model(str(config), seed=s) for s in (0, 0, 1))
    assert a.random_weights and a.source.startswith("random:") and a.config.kv_heads == 2
    assert a.tokenizer is not None                  # SmolLM2's: its 49,152 ids fit this vocabulary
    assert a.sha256_prefix == b.sha256_prefix != c.sha256_prefix
    assert torch.equal(logits_of(a.model), logits_of(b.model))
    assert not torch.equal(logits_of(a.model), logits_of(c.model))


def test_a_preset_name_gives_random_weights_of_its_shape():
    loaded = resolve_model("smollm2-135m", dtype=torch.bfloat16)
    assert loaded.random_weights and loaded.config.layers == 30 and loaded.config.kv_heads == 3
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("name,message", [("gpt-17", "unknown model 'gpt-17'"), ("nothing.gguf", "no such model file")])
def test_unknown_models_are_one_line_errors(name, message):
    with pytest.raises(ModelLoadError, match=message):
        resolve_model(name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from profiler.engine.export_hf import ExportConfig, export_hf

    return export_hf(ExportConfig(out=tmp_path_factory.mktemp("export") / "smollm2-hf"))


def test_export_hf_writes_a_folder_transformers_runs_as_the_gguf(hf_folder, exported):
    # transformers reads the exported folder (weights, config, tokenizer, chat template) with none
    # of its GGUF code and computes the logits it computes from the GGUF itself.
    transformers = pytest.importorskip("transformers")
    _, expected, gguf_model = hf_folder
    model = transformers.AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    with torch.inference_mode():
        logits = model(TOKENS).logits
    assert (logits - expected).abs().max() < 1e-4 * expected.abs().max()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported))
    messages = [{"role": "user", "content": "What is 12 + 30? Answer in one word."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == gguf_model.tokenizer.apply_chat_template(messages)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == gguf_model.tokenizer.encode_chat(messages[0]["content"])
    assert tokenizer.eos_token_id == gguf_model.tokenizer.eos_id
    ours = resolve_model(str(exported))
    torch.testing.assert_close(logits_of(ours.model), logits_of(gguf_model.model), rtol=0, atol=1e-5)


def test_export_hf_refuses_bad_input_and_keeps_what_exists(tmp_path, exported):
    from profiler.cli import main

    assert main(["export-hf", "--out", str(exported)]) == 2            # exists: untouched
    assert (exported / "model.safetensors").exists()
    assert main(["export-hf", "--out", str(tmp_path / "x"), "--model", str(tmp_path)]) == 2
    assert not (tmp_path / "x").exists()
