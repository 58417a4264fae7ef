"""The published large deployments (sim/validate/deployments.py): every case loads as a scenario
with its layout, a case's prediction is what the committed errors.csv says, and a bad case is one
line naming its file and case."""
import pandas as pd
import pytest

from conftest import REPO
from sim.errors import InputError
from sim.validate.deployments import load_deployments, predict_deployments

FOLDER = REPO / "validation/deployments"


def test_every_case_loads_with_the_layout_its_source_states():
    cases = load_deployments(FOLDER)
    assert len({d.source.id for d in cases}) >= 3
    layouts = {d.case.id: d.case.scenario for d in cases}
    assert layouts["lmsys-ep-h100-decode-dp72-b256"]["data_parallel"] == 72
    assert any((s.get("speculation") or {}).get("method") == "mtp" and s.get("data_parallel", 1) > 1
               for s in layouts.values())
    assert any(s.get("disaggregation") for s in layouts.values())


def test_a_prediction_is_what_the_committed_errors_say():
    committed = pd.read_csv(FOLDER / "errors.csv", comment="#").set_index("case")
    (case,) = [d for d in load_deployments(FOLDER) if d.case.id == "trtllm-r1-h200-adp8-c1024"]
    row = predict_deployments([case]).iloc[0]
    assert row.predicted == pytest.approx(committed.loc[case.case.id, "predicted"], rel=1e-9)
    assert row.gpus == 8 and row.layout == "DP8 x TP1 attention, EP8"


def test_a_bad_case_is_one_line_naming_its_file_and_case(tmp_path):
    text = (FOLDER / "trtllm-deepseek-r1-best-perf.yaml").read_text().replace("data_parallel: 8", "data_parallel: 3")
    (tmp_path / "trtllm-deepseek-r1-best-perf.yaml").write_text(text)
    with pytest.raises(InputError) as error:
        load_deployments(tmp_path)
    assert "trtllm-deepseek-r1-best-perf.yaml: case trtllm-r1-h200-adp8-c1024: scenario: expert_parallel: 3 GPUs" \
        in str(error.value)
    with pytest.raises(InputError, match="holds no source files"):
        load_deployments(tmp_path / "none")
