"""Bad input: one line naming the field and the reason, exit code 2, no traceback, nothing written."""
import subprocess
import sys

import pytest
import yaml

from conftest import REPO


@pytest.fixture
def sim_cli(capsys, monkeypatch):
    """`python -m sim ARGS` through the command's own entry point in this process (the same parsing,
    checks and error path, without a process start per case; test_missing_and_malformed_scenario_files
    runs the real command): (exit code, stdout, stderr)."""
    from sim.cli import main

    monkeypatch.chdir(REPO)

    def run(*argv):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:          # argparse's usage errors
            code = exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run

BASE = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
        "workload": {"concurrency": 2, "requests": 4, "prompt_tokens": 64, "output_tokens": 32},
        "speculation": {"method": "eagle", "acceptance": {"rate": 0.7}}}


def with_changes(**changes):
    scenario = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes.items():
        node = scenario
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf)
        else:
            node[leaf] = value
    return scenario


DELETE = object()

CASES = [
    ("unknown field", with_changes(speculation__draft_tokens=3), "speculation.draft_tokens: unknown field"),
    ("unknown top-level field", with_changes(gpu="h100"), "gpu: unknown field"),
    ("unknown hardware preset", with_changes(hardware="h300"), "hardware: unknown preset 'h300'"),
    ("unknown model preset", with_changes(model="llama-9-1t"), "model: unknown preset 'llama-9-1t'"),
    ("unknown engine preset", with_changes(engine="trt"), "engine: unknown preset 'trt'"),
    ("unknown method", with_changes(speculation__method="lookahead"), "speculation.method:"),
    ("zero requests", with_changes(workload__requests=0), "workload.requests: input should be greater than 0"),
    ("negative concurrency", with_changes(workload__concurrency=-4), "workload.concurrency: input should be greater than 0"),
    ("zero k", with_changes(speculation__num_speculative_tokens=0), "speculation.num_speculative_tokens:"),
    ("budget off block", with_changes(speculation__partial_verify={"budget": 1000}),
     "speculation.partial_verify.budget: 1000 is not a multiple of block 16"),
    ("negative seed", with_changes(seed=-1), "seed: input should be greater than or equal to 0"),
    ("per-position spread too wide", with_changes(speculation__acceptance={"per_position": [0.9, 0.8, 0.7],
                                                                          "request_spread": 0.5}),
     "speculation.acceptance.request_spread: 0.5 is too wide for a Beta with mean 0.8"),
    ("draft model of another family", with_changes(speculation__method="draft_model",
                                                    speculation__draft={"model": "smollm2-135m"}),
     "speculation.draft.model: smollm2-135m's vocabulary (49152) is not llama-3.1-8b's (128256)"),
    ("draft model not divisible by TP", with_changes(model="llama-2-70b", tensor_parallel=8, speculation__method="draft_model",
                                                     speculation__draft={"model": "vicuna-33b"}),
     "tensor_parallel: 8 does not divide vicuna-33b's 52 heads"),
    ("non-string preset", with_changes(hardware={"preset": 5}), "hardware.preset: must be a preset name (got 5)"),
    ("infinite datasheet number", with_changes(hardware={"preset": "h100-sxm", "memory_gb": float("inf")}),
     "hardware.memory_gb: must be a positive number (got inf)"),
    ("NaN engine overhead", with_changes(engine={"preset": "vllm", "step_overhead_s": float("nan")}),
     "engine.step_overhead_s: must be a non-negative number (got nan)"),
    ("huge sampled prompt", with_changes(workload__prompt_tokens={"dist": "normal", "mean": 1e30}),
     "workload.prompt_tokens: request 0 needs"),
    ("unknown pcie generation", with_changes(hardware={"preset": "h100-sxm", "pcie_gen": 7}),
     "hardware.pcie_gen: 7 is not one of [3, 4, 5]"),
    ("context beyond maximum", with_changes(model="llama-2-7b", workload__prompt_tokens=4000, workload__output_tokens=200),
     "workload.prompt_tokens: request 0 needs 4203 tokens of context (prompt 4000 + output 200 + 3 drafted)"),
    ("memory too small", with_changes(hardware={"preset": "rtx-4060-ti-8g", "memory_gb": 1}, offload={"weights": 0.0}),
     "hardware.memory_gb: 1 GB"),
    ("both acceptance forms", with_changes(speculation__acceptance={"rate": 0.7, "tokens_per_step": 2.0}),
     "speculation.acceptance: give exactly one of tokens_per_step, rate, per_position, trace (got tokens_per_step, rate)"),
    ("no acceptance form", with_changes(speculation__acceptance={}),
     "speculation.acceptance: give exactly one of tokens_per_step, rate, per_position, trace (got none)"),
    ("speculation without acceptance", with_changes(speculation__acceptance=DELETE),
     "speculation: method eagle needs acceptance"),
    ("rate out of range", with_changes(speculation__acceptance={"rate": 1.5}), "speculation.acceptance.rate:"),
    ("poisson without rate", with_changes(workload__arrival="poisson"), "workload: arrival poisson needs rate_qps"),
    ("tokens per step above k+1", with_changes(speculation__acceptance={"tokens_per_step": 9}),
     "speculation: acceptance.tokens_per_step 9.0 exceeds the 4 a step can commit"),
    ("missing trace file", with_changes(speculation__acceptance={"trace": "no/such.csv"}),
     "speculation.acceptance.trace: no such file"),
    ("engine version the tables lack", with_changes(engine={"preset": "vllm", "version": "0.1.0"}),
     "engine.version: no measured operator tables of vllm 0.1.0 on h100_sxm (held: "),
    ("measured cost on a GPU the tables lack", with_changes(hardware="rtx-3090", cost="measured"),
     "cost: measured: the measured operator tables hold no rtx-3090"),
    ("measured cost on an engine the tables lack", with_changes(engine="gpt-fast", cost="measured"),
     "cost: measured: the measured operator tables hold no engine gpt-fast"),
    ("unknown cost", with_changes(cost="tables"), "cost: input should be 'auto', 'measured' or 'roofline'"),
    ("attention data parallel on a dense model", with_changes(data_parallel=2),
     "data_parallel: llama-3.1-8b has no experts"),
    ("experts over GPUs that do not divide them", with_changes(model="deepseek-v3", dtype="fp8", data_parallel=3,
                                                              expert_parallel=True, speculation__method="mtp",
                                                              hardware="h200"),
     "expert_parallel: 3 GPUs (tensor_parallel x data_parallel) do not divide deepseek-v3's 256 routed experts"),
    ("attention ranks that do not divide the heads", with_changes(model="deepseek-v3", dtype="fp8", data_parallel=2,
                                                                 tensor_parallel=3, speculation__method="mtp",
                                                                 hardware="h200"),
     "tensor_parallel: 3 does not divide deepseek-v3's 128 heads"),
    ("zero data-parallel ranks", with_changes(data_parallel=0), "data_parallel: input should be greater than 0"),
    ("more GPUs than a node without a network", with_changes(hardware="rtx-4090", tensor_parallel=16),
     "hardware.network_gb_s: rtx-4090 has no network between nodes; 16 GPUs (tensor_parallel x data_parallel) "
     "exceed the 8 its interconnect joins"),
    ("a prefill pool whose layout does not divide the heads",
     with_changes(disaggregation={"prefill": {"tensor_parallel": 3}}),
     "disaggregation.prefill.tensor_parallel: 3 does not divide llama-3.1-8b's 32 heads"),
    ("a KV transfer over a network the hardware lacks",
     with_changes(hardware={"preset": "h100-sxm", "network_gb_s": 0}, disaggregation={"prefill": {}}),
     "disaggregation.transfer.link: h100-sxm has no network between nodes"),
    ("pools past the NVLink domain joined by NVLink",
     with_changes(tensor_parallel=8, disaggregation={"prefill": {"instances": 2, "tensor_parallel": 4},
                                                     "transfer": {"link": "nvlink"}}),
     "disaggregation.transfer.link: nvlink joins 8 GPUs of h100-sxm; the pools hold 16 (prefill 8 + decode 8)"),
    ("a disaggregated static batch", with_changes(scheduler={"batching": "static"}, disaggregation={"prefill": "unlimited"}),
     "disaggregation: a decode pool batches continuously"),
    ("an unknown prefill pool", with_changes(disaggregation={"prefill": "infinite"}), "disaggregation.prefill"),
    ("redundant experts without expert parallelism",
     with_changes(model="deepseek-v3", dtype="fp8", hardware="h200", tensor_parallel=8, redundant_experts=32,
                  speculation__method="mtp"),
     "redundant_experts: copies experts placed whole: it needs expert_parallel: true"),
    ("two-batch overlap not a boolean", with_changes(engine={"preset": "sglang", "two_batch_overlap": "yes"}),
     "engine.two_batch_overlap: must be true or false (got 'yes')"),
]


@pytest.mark.parametrize("name,scenario,message", CASES, ids=[c[0] for c in CASES])
def test_bad_scenario_is_one_line_naming_the_field(tmp_path, name, scenario, message, sim_cli):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "result.json"
    code, stdout, stderr = sim_cli("run", path, "--out", out)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: " + message), lines[0]
    assert stdout == ""
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [path]


def test_missing_and_malformed_scenario_files(tmp_path):
    for text, message in ((None, "cannot read"), ("a: [1, 2", "is not valid YAML"), ("- 1\n- 2\n", "must hold a mapping")):
        path = tmp_path / "bad.yaml"
        if text is None:
            path = tmp_path / "absent.yaml"
        else:
            path.write_text(text)
        proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path)], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def run_scenario(sim_cli, tmp_path, scenario, *extra):
    """`sim run` on the scenario: (exit code, stdout, stderr)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return sim_cli("run", path, *extra)


ACCEPTANCE_TRACE = ("speculation.acceptance.trace", lambda path: {"speculation__acceptance": {"trace": path}})
REQUEST_TRACE = ("workload.trace", lambda path: {"workload__arrival": "trace", "workload__trace": path})


@pytest.mark.parametrize("kind,content,message", [
    (ACCEPTANCE_TRACE, "accepted\n1\n2.5\n", "row 1: accepted must be an integer below 2^31, >= 0 (got 2.5)"),
    (ACCEPTANCE_TRACE, "request,accepted\n0,1\n0,\n", "row 1: accepted must be an integer below 2^31, >= 0 (got nan)"),
    (ACCEPTANCE_TRACE, "accepted\n1\nx\n", "row 1: accepted must be an integer below 2^31, >= 0 (got 'x')"),
    (ACCEPTANCE_TRACE, "steps\n1\n", "lacks column accepted"),
    (REQUEST_TRACE, "arrival_s,prompt_tokens,output_tokens\n0,1e30,20\n",
     "row 0: prompt_tokens must be an integer below 2^31"),
    (REQUEST_TRACE, "arrival_s,prompt_tokens,output_tokens\n-1,10,20\n", "row 0: arrival_s must be a number, >= 0 (got -1)"),
    (REQUEST_TRACE, "arrival_s,prompt_tokens\n0,10\n", "lacks column output_tokens"),
])
def test_bad_trace_file_is_one_line(tmp_path, kind, content, message, sim_cli):
    field, changes = kind
    trace = tmp_path / "trace.csv"
    trace.write_text(content)
    code, _, stderr = run_scenario(sim_cli, tmp_path, with_changes(**changes(str(trace))))
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.strip().startswith(f"error: {field}: ") and message in stderr


@pytest.mark.parametrize("config,message", [
    ([1, 2], "config.json must hold a mapping"),
    ({"hidden_size": 64, "num_attention_heads": 0}, "num_attention_heads must be a positive integer (got 0)"),
    ({"num_attention_heads": 4}, "config.json lacks hidden_size"),
])
def test_bad_config_json_is_one_line(tmp_path, config, message, sim_cli):
    import json
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, _, stderr = run_scenario(sim_cli, tmp_path, with_changes(model=str(path)))
    assert code == 2 and stderr.count("\n") == 1
    assert stderr.strip().startswith("error: model: ") and message in stderr


def test_unwritable_out_is_one_line(tmp_path, sim_cli):
    code, _, stderr = run_scenario(sim_cli, tmp_path, BASE, "--out", str(tmp_path))
    assert code == 2 and stderr.strip() == f"error: --out: cannot write {tmp_path}: Is a directory"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly():
    # `python -m sim tables | head -2`: the printout's rest goes nowhere, exit 1, no traceback.
    code = ("import sys\nfrom sim.errors import exit_code\n"
            "def printout():\n    print('first')\n    raise BrokenPipeError\n"
            "sys.exit(exit_code(printout))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == ""
