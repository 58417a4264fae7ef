"""Re-run every `$ command` shown in a markdown file's fenced blocks and refresh its output.

A block in the docs looks like

    ```
    $ python -m sim run scenarios/eagle-h100.yaml
    <output>
    ```

`python scripts/doc_outputs.py docs/scenario.md` rewrites each output from a fresh run (atomically);
`--check` changes nothing and exits 1 naming every block whose output differs, so a test keeps the
numbers in the docs reproduced by the commands printed beside them. Commands run with bash from the
repository root.
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


def run(command: str) -> str:
    proc = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    return proc.stdout + proc.stderr


def refresh(text: str) -> tuple[str, list[str]]:
    stale = []

    def replace(match: re.Match) -> str:
        command = match.group(1)[2:].rstrip("\n")
        output = run(command)
        if output != match.group(2):
            stale.append(command)
        return f"```\n$ {command}\n{output}```"

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
