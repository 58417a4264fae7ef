"""`python -m profiler live`: the files it writes, and one-line errors that write nothing."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pd = pytest.importorskip("pandas")

from conftest import REPO  # noqa: E402


def live(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "profiler", "live", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


def test_live_run_writes_steps_requests_summary_outputs_and_meta(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count from 1 to 20: 1, 2, 3, 4, 5, 6, 7, 8, {i}",
                                           "category": "count"}) + "\n" for i in (9, 9)))
    out = tmp_path / "run"
    proc = live("--method", "ngram", "--k", 3, "--batch", 2, "--prompts", prompts, "--max-new-tokens", 12,
                "--check-lossless", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "outputs.jsonl", "requests.parquet",
                                                    "steps.parquet", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lossless_mismatches"] == []
    assert summary["speedup"] == pytest.approx(summary["throughput_tok_s"] / summary["baseline_throughput_tok_s"])
    assert summary["tokens_per_step"] > 1.5          # counting is what prompt lookup is good at
    steps = pd.read_parquet(out / "steps.parquet")
    assert set(steps.columns) >= {"request", "step", "mode", "query_tokens", "kv_tokens", "drafted", "accepted",
                                  "accept_flags", "committed", "draft_s", "verify_s", "other_s"}
    assert (steps["drafted"] == 3).all() and steps["committed"].between(1, 4).all()
    requests = pd.read_parquet(out / "requests.parquet")
    assert list(requests["output_tokens"]) == [12, 12]
    assert (requests["ttft_s"] > 0).all()
    meta = json.loads((out / "meta.json").read_text())
    for key in ("device", "threads", "torch", "dtype", "model", "model_hash", "arguments", "git_revision", "seed"):
        assert key in meta
    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert [len(o["tokens"]) for o in outputs] == [12, 12] and "2, 3" in outputs[0]["text"]


@pytest.mark.parametrize("args,message", [
    (["--model", "llama-9t"], "--model: unknown model 'llama-9t'"),
    (["--model", "missing.gguf"], "--model: no such model file: missing.gguf"),
    (["--k", "0"], "--k: must be >= 1 (got 0)"),
    (["--method", "medusa"], "argument --method: invalid choice"),
    (["--context", "4096"], "--context: long-context mode needs both --context and --text"),
    (["--temperature", "-1"], "--temperature: must be >= 0 (got -1.0)"),
    (["--warmup-tokens", "-1"], "--warmup-tokens: must be >= 0 (got -1)"),
    (["--max-new-tokens", "9000"], "exceed the model's maximum context 8192"),
    (["--budget", "256"], "--budget: 256 is not below the context"),
    (["--budget", "24"], "--budget: must be a positive multiple of --block 16 (got 24)"),
    (["--budget", "16", "--period", "0"], "--period: must be >= 1 (got 0)"),
    (["--rectify"], "--rectify: needs --budget (partial verification)"),
    (["--device", "cuda"], "--device: cuda is not available here"),
    (["--tree", "2"], "argument --tree: expects W,D with positive integers (got '2')"),
    (["--method", "none", "--tree", "2,2"], "--tree: needs a drafter"),
    (["--method", "draft_model", "--draft-model", "nowhere.gguf"], "--draft-model: no such model file: nowhere.gguf"),
    (["--rate", "2"], "--rate: needs --serving continuous"),
    (["--serving", "continuous", "--rate", "0"], "--rate: must be > 0 requests per second (got 0.0)"),
    (["--serving", "continuous", "--rate", "1", "--concurrency", "2"], "--rate: give one of --concurrency, --rate"),
    (["--serving", "continuous", "--arrivals", "nowhere.txt"], "--arrivals: nowhere.txt is not a file"),
    (["--serving", "continuous", "--prefill-chunk", "0"], "--prefill-chunk: must be >= 1 (got 0)"),
    (["--policy", "sometimes"], "--policy: unknown policy 'sometimes' (known: static, off_above_batch:N, goodput)"),
    (["--policy", "off_above_batch:x"], "--policy: off_above_batch needs a batch size >= 0"),
    (["--method", "none", "--policy", "off_above_batch:2"], "--policy: off_above_batch needs a drafter"),
    (["--policy", "goodput"], "--policy: goodput prices each step's k with a calibration bundle: give --calibration"),
    (["--policy", "goodput", "--calibration", "nowhere"], "--calibration: nowhere is not a calibration bundle"),
    (["--calibration", "calibration/cpu/smollm2-135m"], "--calibration: only --policy goodput prices steps"),
    (["--policy", "goodput", "--tree", "2,2", "--calibration", "calibration/cpu/smollm2-135m"],
     "--policy: goodput chooses a chain's k"),
    (["--policy", "off_above_batch:2", "--budget", "16"], "--policy: off_above_batch does not combine with --budget"),
    # The synthetic drafter (tests/profiler/test_synthetic.py has the rest of it).
    (["--method", "synthetic"], "--acceptance: the synthetic drafter keeps each draft position with a set chance"),
    (["--method", "synthetic", "--acceptance", "1.2"], "--acceptance: each rate must be in [0, 1] (got 1.2)"),
    (["--method", "synthetic", "--acceptance", "0.9,-0.1"], "--acceptance: each rate must be in [0, 1] (got -0.1)"),
    (["--method", "synthetic", "--acceptance", "high"], "argument --acceptance: expects a rate or comma-separated"),
    (["--method", "ngram", "--acceptance", "0.8"], "--acceptance: belongs to the synthetic drafter; give --method synthetic"),
    (["--method", "ngram", "--draft-shape", "head"], "--draft-shape: belongs to the synthetic drafter"),
    (["--method", "synthetic", "--acceptance", "0.8", "--draft-shape", "tiny"], "--draft-shape: unknown draft shape 'tiny'"),
    (["--method", "synthetic", "--acceptance", "0.8", "--draft-shape", "qwen3-30b-a3b"],
     "--draft-shape: qwen3-30b-a3b is a mixture of experts"),
    (["--method", "synthetic", "--acceptance", "0.8", "--temperature", "0.5"],
     "--temperature: the synthetic drafter drafts the target's greedy continuation"),
    (["--method", "synthetic", "--acceptance", "0.8", "--policy", "goodput", "--calibration",
      "calibration/cpu/smollm2-135m"], "--policy: goodput does not price the synthetic drafter"),
])
def test_bad_live_arguments_are_one_line_and_write_nothing(tmp_path, args, message, capsys, monkeypatch):
    # The command's own entry point, in this process: the same parsing, checks and error path as
    # `python -m profiler live` (which test_live_run_writes_... runs), without a process start each.
    from profiler.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    out = tmp_path / "out"
    monkeypatch.chdir(REPO)
    try:
        code = main(["live", "--prompts", str(prompts), "--out", str(out), *args])
    except SystemExit as exc:          # argparse's usage errors
        code = exc.code
    stderr = capsys.readouterr().err
    assert code == 2
    assert stderr.count("\n") == 1 and message in stderr, stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_continuous_serving_records_arrivals_queueing_and_inter_token_gaps(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count from 1 to 20: 1, 2, 3, 4, {i}", "category": "count"}) + "\n"
                               for i in (5, 5, 5)))
    times = tmp_path / "arrivals.txt"
    times.write_text("# seconds\n0\n0\n0.05\n")
    bad = tmp_path / "bad.txt"
    bad.write_text("0\nsoon\n1\n")
    proc = live("--serving", "continuous", "--arrivals", bad, "--prompts", prompts, "--out", tmp_path / "never")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "every line must be a number" in proc.stderr
    out = tmp_path / "run"
    proc = live("--serving", "continuous", "--arrivals", times, "--batch", 2, "--prefill-chunk", 8, "--method", "ngram",
                "--k", 3, "--prompts", prompts, "--max-new-tokens", 10, "--check-lossless", "--out", out)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["serving"] == "continuous" and summary["lossless_mismatches"] == []
    requests = pd.read_parquet(out / "requests.parquet")
    assert list(requests["arrival_s"]) == [0.0, 0.0, 0.05] and (requests["queue_s"] >= 0).all()
    assert (requests["itl_p50_s"] > 0).all() and (requests["finish_s"] > requests["ttft_s"]).all()
    assert json.loads((out / "meta.json").read_text())["arguments"]["arrivals"].endswith("arrivals.txt")
    # The simulator serves it the same way: the requests at their arrival times, 2 rows, 8-token chunks.
    proc = subprocess.run([sys.executable, "-m", "sim", "validate", str(out), "--calibration",
                           "calibration/cpu/smollm2-135m", "--out", str(tmp_path / "v")], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_csv(tmp_path / "v" / "validation.csv", comment="#")
    assert set(rows.prediction) >= {"replay"} and rows.predicted_tok_s.gt(0).all()
    # Served runs are also compared on their median request's latencies.
    for metric in ("ttft_p50_ms", "tpot_p50_ms"):
        assert rows[f"measured_{metric}"].gt(0).all() and rows[f"predicted_{metric}"].gt(0).all()


def test_prompts_per_category_take_the_categories_in_turn(tmp_path):
    from profiler.live.prompts import read_prompts

    prompts = tmp_path / "p.jsonl"
    rows = [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("c", 2)]
    prompts.write_text("".join(json.dumps({"category": c, "turns": [f"{c}{i}", "second turn"]}) + "\n" for c, i in rows))
    texts = lambda got: [r["text"] for r in got]
    assert texts(read_prompts(prompts, None, 2)) == ["a1", "b1", "c1", "a2", "c2"]
    assert texts(read_prompts(prompts, 4, 2)) == ["a1", "b1", "c1", "a2"]
    assert texts(read_prompts(prompts, 2)) == ["a1", "a2"]
    proc = live("--prompts", prompts, "--per-category", "0", "--out", tmp_path / "out")
    assert proc.returncode == 2 and "--per-category: must be >= 1" in proc.stderr


def test_empty_prompt_file_and_existing_out_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    proc = live("--prompts", empty, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "--prompts: " in proc.stderr and "has no prompts" in proc.stderr
    proc = live("--prompts", empty, "--out", tmp_path)
    assert proc.returncode == 2 and "exists; give a new folder" in proc.stderr


def test_unsupported_architectures_are_refused(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 768}))
    proc = live("--model", folder, "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--model: " in proc.stderr and "GPT2LMHeadModel is not supported" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_random_weights_of_a_preset_run_with_a_saved_tokenizer(tmp_path):
    gguf = pytest.importorskip("gguf")
    from profiler.engine.gguf_loader import smollm2_path
    from profiler.engine.tokenizer import tokenizer_from_gguf

    tokenizer = tmp_path / "tokenizer.json"
    tokenizer_from_gguf(gguf.GGUFReader(smollm2_path())).save(tokenizer)
    out = tmp_path / "run"
    proc = live("--model", "smollm2-135m", "--tokenizer", tokenizer, "--method", "ngram", "--k", 2, "--limit", 1,
                "--max-new-tokens", 4, "--out", out)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["random_weights"] and meta["model"].startswith("random:smollm2-135m")
    assert json.loads((out / "summary.json").read_text())["requests"] == 1
    # An untimed warm-up pass first (the default on a GPU) leaves the recorded run as it was.
    warmed = tmp_path / "warmed"
    proc = live("--model", "smollm2-135m", "--tokenizer", tokenizer, "--method", "ngram", "--k", 2, "--limit", 1,
                "--max-new-tokens", 4, "--warmup-tokens", 3, "--out", warmed)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((warmed / "meta.json").read_text())["arguments"]["warmup_tokens"] == 3
    columns = ["step", "mode", "query_tokens", "kv_tokens", "drafted", "accepted", "committed"]
    assert pd.read_parquet(warmed / "steps.parquet")[columns].equals(pd.read_parquet(out / "steps.parquet")[columns])
    assert (warmed / "outputs.jsonl").read_text() == (out / "outputs.jsonl").read_text()


def test_the_warm_up_pass_is_on_by_default_on_a_gpu_only(tmp_path):
    from profiler.live.config import LiveConfig
    from profiler.live.run import warmup_tokens

    assert warmup_tokens(LiveConfig(out=tmp_path, device="cuda")) == 8
    assert warmup_tokens(LiveConfig(out=tmp_path)) == 0
    assert warmup_tokens(LiveConfig(out=tmp_path, device="cuda", warmup_tokens=0)) == 0
    assert warmup_tokens(LiveConfig(out=tmp_path, warmup_tokens=5)) == 5
    assert warmup_tokens(LiveConfig(out=tmp_path, device="cuda", max_new_tokens=3)) == 3


def test_the_warm_up_runs_the_first_batch_untimed_with_and_without_the_drafter(tmp_path, monkeypatch):
    import profiler.live.run as live_run
    from profiler.live.config import LiveConfig

    calls = []
    monkeypatch.setattr(live_run, "run_batches",
                        lambda model, prompts, settings, drafter, eos, label, policy=None, cache_tokens=0:
                        calls.append((len(prompts), settings.max_new_tokens, settings.serving, drafter, policy,
                                      cache_tokens)))
    prompts = [[1, 2, 3]] * 5
    settings = LiveConfig(out=tmp_path, device="cuda", batch=2, serving="continuous", baseline=True)
    # The warm-up's cache is the run's (cache_tokens), so the run keeps it and the graphs on it.
    live_run.warm_up("model", prompts, settings, "drafter", 0, cache_tokens=99)
    assert calls == [(2, 8, "static", "drafter", None, 99), (2, 8, "static", None, None, 99)]
    calls.clear()
    live_run.warm_up("model", prompts, settings.model_copy(update={"device": "cpu"}), "drafter", 0)
    assert calls == []
