"""Re-run every `$ command` shown in a markdown file's fenced blocks and refresh its output.

A block in the docs looks like

    ```
    $ python -m sim run scenarios/eagle-h100.yaml
    <output>
    ```

`python scripts/doc_outputs.py docs/scenario.md` rewrites each output from a fresh run (atomically);
`--check` changes nothing and exits 1 naming every block whose output differs, so a test keeps the
numbers in the docs reproduced by the commands printed beside them. Commands run with bash from the
repository root, as many at a time as the machine has cores, except that commands naming the same
/tmp path (one writes what a later one reads) run in the docs' order.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from sim.formats.files import write_atomic

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```\n(\$ [^\n]*\n)(.*?)^```$", re.M | re.S)


TMP_PATH = re.compile(r"/tmp/[\w.-]+")


def run_after(before: list, command: str) -> str:
    for future in before:
        future.result()
    return run(command)


def run(command: str) -> str:
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    return proc.stdout + proc.stderr


def refresh(text: str) -> tuple[str, list[str]]:
    """The text with every block's output run afresh, and the commands whose output changed."""
    from concurrent.futures import ThreadPoolExecutor

    commands = [match.group(1)[2:].rstrip("\n") for match in BLOCK.finditer(text)]
    running: dict[str, object] = {}         # a /tmp path -> the last command naming it, running
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {}
        for command in commands:
            paths = set(TMP_PATH.findall(command))
            before = [running[path] for path in paths if path in running]
            futures[command] = pool.submit(run_after, before, command)
            running.update(dict.fromkeys(paths, futures[command]))
        outputs = {command: future.result() for command, future in futures.items()}
    stale = []

    def replace(match: re.Match) -> str:
        command = match.group(1)[2:].rstrip("\n")
        if outputs[command] != match.group(2):
            stale.append(command)
        return f"```\n$ {command}\n{outputs[command]}```"

    return BLOCK.sub(replace, text), stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="report stale outputs, change nothing")
    args = parser.parse_args()
    failed = False
    for path in args.files:
        text = path.read_text()
        fresh, stale = refresh(text)
        for command in stale:
            print(f"{path}: stale output of: {command}", file=sys.stderr)
        failed |= bool(stale)
        if stale and not args.check:
            write_atomic(path, fresh)
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
