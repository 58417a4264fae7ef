"""The arguments of each `python -m sim` command (sim/cli.py runs them)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML (docs/scenario.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field, e.g. workload.concurrency=64 (repeatable)")
    parser.add_argument("--vary", metavar="FIELD=V1,V2,...",
                        help="run once per value of one field and print a row per run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    parser.add_argument("--out", type=Path, help="also write the JSON to this file")
    parser.add_argument("--cost", choices=("auto", "measured", "roofline"),
                        help="what prices the GPU's kernels: the measured operator tables (aiconfigurator-core) or "
                             "the roofline (default: the scenario's `cost`, auto: the tables where they cover it)")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", nargs="?", help="study YAML, or an embedded study's name (default, smoke); "
                                                  "default: the embedded default study")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: a process pool on this machine; ray: a Ray cluster (or a local Ray instance)")
    parser.add_argument("--address", help="with --executor ray: the cluster's address (auto, or HOST:PORT)")
    parser.add_argument("--workers", type=int, help="worker processes (default: the CPU count)")
    parser.add_argument("--resume", action="store_true", help="continue a sweep in --out, skipping finished points")
    parser.add_argument("--overwrite", action="store_true", help="discard the results already in --out and start again")
    parser.add_argument("--out", type=Path, help="output folder (default reports/STUDY_NAME)")
    parser.add_argument("--validation", type=Path, help="a validation.csv from sim validate, for the report's parity "
                                                        "plot (default: the study's `validation`, when present)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--cost", choices=("auto", "measured", "roofline"),
                        help="what prices the GPU points' kernels (default: each point's `cost`, auto: the measured "
                             "operator tables where they cover it); points with a calibration keep it")
    parser.add_argument("--no-baseline-reuse", action="store_true",
                        help="simulate every point's baseline afresh (same results, slower; for checking)")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", type=Path, metavar="RESULTS", help="a sweep's folder or its results.parquet")
    parser.add_argument("--validation", type=Path, help="a validation.csv for the parity plot")
    parser.add_argument("--out", type=Path, help="HTML file to write (default: report.html beside the results)")


def add_capacity_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML with an slo block")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field (repeatable)")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="stop when the bracket is narrower than this fraction of the rate (default 0.02)")
    parser.add_argument("--max-rate", type=float, help="highest rate to try, in requests/s")
    parser.add_argument("--pools", action="store_true",
                        help="size a disaggregated scenario's prefill servers and decode ranks instead: the fewest "
                             "GPUs meeting its SLOs at its own Poisson rate")
    parser.add_argument("--max-gpus", type=int, default=64, help="with --pools: most GPUs to try (default 64)")
    parser.add_argument("--cost", choices=("auto", "measured", "roofline"),
                        help="what prices the GPU's kernels: the measured operator tables (aiconfigurator-core) or "
                             "the roofline (default: the scenario's `cost`, auto: the tables where they cover it)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")


def add_recommend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", type=Path, help="scenario YAML with a speculation method")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a field (repeatable)")
    parser.add_argument("--batches", type=_int_list("--batches"), default=None, metavar="B1,B2,...",
                        help="batch sizes (closed-loop clients) to try (default 1,2,4,...,256)")
    parser.add_argument("--contexts", type=_int_list("--contexts"), default=None, metavar="C1,C2,...",
                        help="prompt tokens to try (default: the scenario's own)")
    parser.add_argument("--max-k", type=int, default=None,
                        help="longest chain tried (default: the larger of the scenario's k and 6)")
    parser.add_argument("--cost", choices=("auto", "measured", "roofline"),
                        help="what prices the GPU's kernels: the measured operator tables (aiconfigurator-core) or "
                             "the roofline (default: the scenario's `cost`, auto: the tables where they cover it)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR",
                        help="folders written by profiler live, or campaign folders written by profiler campaign "
                             "(every run of every repeat)")
    parser.add_argument("--calibration", type=Path,
                        help="calibration bundle (default: a campaign's own, else the roofline model)")
    parser.add_argument("--published", type=Path, nargs="?", const=Path("-"), metavar="CATALOGUE",
                        help="predict the published-measurement catalogue instead (default folder: "
                             "validation/published): errors.csv and parity.html, fit and held half apart")
    parser.add_argument("--deployments", type=Path, nargs="?", const=Path("-"), metavar="FOLDER",
                        help="predict the published large deployments instead (default folder: "
                             "validation/deployments): attention data parallel, expert parallel, disaggregated "
                             "pools; errors.csv there (or in --out)")
    parser.add_argument("--scenarios", type=Path, metavar="DIR",
                        help="with --published: also write each case's scenario as DIR/CASE.yaml (for sim run)")
    parser.add_argument("--cost", choices=("auto", "measured", "roofline"),
                        help="what prices the GPU's kernels: the measured operator tables (aiconfigurator-core) or "
                             "the roofline (default: the scenario's `cost`, auto: the tables where they cover it)")
    parser.add_argument("--fit", action="store_true",
                        help="with --published: search the GEMM corners and speculative host times on the fit "
                             "half and print them (the presets hold the result)")
    parser.add_argument("--out", type=Path, help="write validation.csv and parity.html here (with --published: "
                                                 "errors.csv and parity.html; default the catalogue folder)")
    parser.add_argument("--docs", type=Path, help="with --out: replace the table between this Markdown file's "
                                                  "validation markers named after the --out folder")


def add_fit_acceptance_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="*", metavar="RUN_DIR",
                        help="folders written by profiler live, or campaign folders")
    parser.add_argument("--vllm", type=Path, action="append", default=[], metavar="FILE",
                        help="vLLM speculative decoding counters: a /metrics scrape or JSON lines (repeatable)")
    parser.add_argument("-o", "--out", type=Path, required=True, help="acceptance YAML to write")


def add_oracle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("positions", type=Path, metavar="POSITIONS", help="the table written by profiler positions")
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR", help="live run folders, or campaign folders "
                                                                               "(their autoregressive runs included)")
    parser.add_argument("--calibration", type=Path, help="the bundle that prices the runs (as sim validate)")
    parser.add_argument("--pair", action="append", default=[], metavar="A,B",
                        help="drafter labels (as sim validate prints them) to combine per step, A's pricing "
                             "(repeatable)")
    parser.add_argument("--docs", type=Path, help="a markdown file whose oracle table to replace")



def add_tables_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", help="a hardware preset: its tables only")
    parser.add_argument("--engine", help="an engine preset (vllm, sglang, tensorrt-llm): its tables only")
    parser.add_argument("--check", action="store_true",
                        help="hold out every fifth measured point of each table and print how well the "
                             "interpolation predicts it, per GPU, engine and operator family (current versions)")
    parser.add_argument("--docs", type=Path, help="with --check: also replace the table between this Markdown "
                                                  "file's validation:operator-tables markers")


def add_import_profile_arguments(parser: argparse.ArgumentParser) -> None:
    from sim.imports import KINDS

    parser.add_argument("kind", choices=tuple(KINDS),
                        help="the source's format: Vidur's network/*/<collective>.csv; a collective table "
                             "transcribed from a page (op, ranks, elements, dtype_bytes, ms, library); Vidur's "
                             "compute/<gpu>/<model>/mlp.csv; or Vidur's <gpu>/cpu_overheads.csv")
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="the source's tables (one a collective)")
    parser.add_argument("--out", type=Path, required=True, help="the published profile's folder to write")
    parser.add_argument("--source", default="Vidur", help="who published the table")
    parser.add_argument("--repository", required=True, help="the repository or page the files come from")
    parser.add_argument("--path", required=True, help="where in it")
    parser.add_argument("--commit", required=True, help="the repository's commit (or the page's date)")
    parser.add_argument("--licence", required=True, help="the source's licence")
    parser.add_argument("--hardware", required=True, help="the hardware preset the source measured on")
    parser.add_argument("--interconnect",
                        help="collectives: the GPU-to-GPU link class, as hardware presets name it (nvlink4, nvlink3, ...)")
    parser.add_argument("--library", default="nccl",
                        help="the collectives' library: nccl, rccl, vllm-custom, sglang-custom, trtllm-custom, custom "
                             "or deepep (an all-to-all)")
    parser.add_argument("--engine", help="host tables: the engine whose iterations were timed")


def _int_list(flag: str):
    def parse(text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects integers separated by commas (got {text!r})") from None
    return parse
