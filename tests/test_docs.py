"""Every number in the docs is reproduced by the command printed beside it."""
import subprocess
import sys

from conftest import REPO


def test_scenario_doc_outputs_are_what_their_commands_print():
    proc = subprocess.run([sys.executable, "scripts/doc_outputs.py", "--check", "docs/scenario.md"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_architecture_page_lists_every_command_of_both_command_lines():
    from profiler.cli import CLI as PROFILER
    from sim.cli import CLI as SIM

    page = (REPO / "docs/architecture.md").read_text()
    listed = {line.split("`")[1] for line in page.splitlines() if line.startswith("| `python -m ")}
    every = {f"{cli.prog} {command.name}" for cli in (SIM, PROFILER) for command in cli.commands}
    assert listed == every
