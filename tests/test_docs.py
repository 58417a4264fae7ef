"""Every number in the docs is reproduced by the command printed beside it."""
import subprocess
import sys

from conftest import REPO


def test_scenario_doc_outputs_are_what_their_commands_print():
    proc = subprocess.run([sys.executable, "scripts/doc_outputs.py", "--check", "docs/scenario.md"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
