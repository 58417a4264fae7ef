"""The layers hold: kernels import nothing of ours, sim never imports profiler, the kernels or
torch, profiler reads only sim's formats, presets and cost model, and no package has an import
cycle between its modules (the import-linter contracts in pyproject.toml); the step and the cost
model type-check (mypy, pyproject.toml's [tool.mypy]); no file of sim is over 400 lines."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint).exists():
        pytest.fail("lint-imports is not installed (pip install -e '.[test]')")
    proc = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Contracts: 4 kept, 0 broken." in proc.stdout


def test_sim_starts_without_torch():
    """A sweep must start fast on a machine with no GPU stack: importing all of sim loads no torch."""
    code = ("import sys, sim, sim.cli, sim.sweep.commands, sim.validate.commands, sim.sweep.report, sim.capacity, "
            "sim.analytic; print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_the_step_and_the_cost_model_type_check():
    mypy = pytest.importorskip("mypy.api")
    stdout, stderr, status = mypy.run(["--config-file", str(REPO / "pyproject.toml")])
    assert status == 0, stdout[-3000:] + stderr[-1000:]


def test_no_file_of_sim_is_over_400_lines():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "sim").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split by concept: {long}"
