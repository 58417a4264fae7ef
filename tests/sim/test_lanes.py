"""Route (a drafter per request category) and combine (prompt lookup beside a model drafter)."""
import copy
import subprocess
import sys

import numpy as np
import pytest
import yaml

import sim
from conftest import REPO
from sim.workload import build_requests

EAGLE = {"hardware": "h100-sxm", "model": "llama-3.1-8b",
         "workload": {"concurrency": 8, "requests": 240, "output_tokens": 120, "categories": {"code": 1, "chat": 1}},
         "speculation": {"method": "eagle", "num_speculative_tokens": 3, "acceptance": {"tokens_per_step": 2.0}}}
LOOKUP = {"method": "ngram", "num_speculative_tokens": 4, "acceptance": {"tokens_per_step": 3.0}}


def with_policy(policy, scenario=EAGLE, **workload) -> dict:
    out = copy.deepcopy(scenario)
    out["speculation"]["policy"] = policy
    out["workload"].update(workload)
    return out


def test_categories_are_drawn_by_seed_without_moving_the_lengths():
    plain = copy.deepcopy(EAGLE)
    plain["workload"] = {**plain["workload"], "categories": None,
                         "output_tokens": {"dist": "lognormal", "mean": 120, "std": 60}}
    tagged = copy.deepcopy(plain)
    tagged["workload"]["categories"] = {"code": 1, "chat": 3}
    a, b = build_requests(sim.load_scenario(plain)), build_requests(sim.load_scenario(tagged))
    assert np.array_equal(a.output_tokens, b.output_tokens) and a.category is None
    assert b.category_names == ("chat", "code")
    assert abs(np.mean(b.category == 1) - 0.25) < 0.07
    assert np.array_equal(b.category, build_requests(sim.load_scenario(tagged)).category)


def test_route_commits_each_category_at_its_own_drafter_rate():
    result = sim.simulate(with_policy({"route": {"code": LOOKUP}}))
    requests = build_requests(result.scenario)
    code = requests.category == requests.category_names.index("code")
    # Constant acceptance: code requests commit 3 tokens a step, chat ones 2 (within half a token
    # per request), so the mean per request-step is the step-weighted mix.
    out = requests.output_tokens - 1
    steps_code, steps_chat = (out[code] / 3).sum(), (out[~code] / 2).sum()
    expected = out.sum() / (steps_code + steps_chat)
    assert result.run.tokens_per_step == pytest.approx(expected, rel=0.02)
    assert result.run.lookup_share == pytest.approx(steps_code / (steps_code + steps_chat), rel=0.02)


def test_route_of_every_category_to_none_is_the_baseline():
    result = sim.simulate(with_policy({"route": {"code": {"method": "none"}, "chat": {"method": "none"}}}))
    assert result.run.throughput_tok_s == result.baseline.throughput_tok_s
    assert result.run.tokens_per_step == 1.0


def test_route_of_every_category_to_the_method_is_static():
    same = {"method": "eagle", "acceptance": {"tokens_per_step": 2.0}}
    routed = sim.simulate(with_policy({"route": {"code": same, "chat": same}}))
    static = sim.simulate(with_policy("static"))
    assert routed.run.tokens_per_step == static.run.tokens_per_step
    assert routed.run.throughput_tok_s == pytest.approx(static.run.throughput_tok_s, rel=1e-9)


def test_plain_requests_in_a_speculative_batch_wait_for_its_steps():
    # Code requests decode without speculation beside chat ones drafting with EAGLE: each of their
    # steps is a speculative step's length for one token. In a closed loop the slow ones pile up,
    # and here the mix is slower than no speculation at all.
    half = sim.simulate(with_policy({"route": {"code": {"method": "none"}}}))
    assert 1.0 < half.run.tokens_per_step < 2.0 and half.run.lookup_share == 0.0
    assert half.run.throughput_tok_s < half.baseline.throughput_tok_s


@pytest.mark.parametrize("share", [0.3, 0.7])
def test_combine_verifies_lookup_where_it_proposes(share):
    lookup = {**LOOKUP, "acceptance": {"tokens_per_step": 3.0, "draft_share": share}}
    result = sim.simulate(with_policy({"combine": {"drafter": lookup}}))
    assert result.run.lookup_share == pytest.approx(share, abs=0.03)
    # 3 tokens where lookup proposes, 2 elsewhere
    assert result.run.tokens_per_step == pytest.approx(3 * share + 2 * (1 - share), abs=0.05)


def test_combine_confident_ignores_a_lookup_that_expects_less_and_pays_only_its_search():
    weak = {**LOOKUP, "acceptance": {"rate": 0.2, "draft_share": 0.5}}
    static = sim.simulate(with_policy("static"))
    confident = sim.simulate(with_policy({"combine": {"drafter": weak, "rule": "confident"}}))
    proposes = sim.simulate(with_policy({"combine": {"drafter": weak}}))
    assert confident.run.lookup_share == 0.0
    assert confident.run.tokens_per_step == static.run.tokens_per_step
    # The same steps, each longer by its host lookups
    assert confident.run.iterations == static.run.iterations
    lookups_s = confident.run.phase_s["draft"] - static.run.phase_s["draft"]
    assert lookups_s > 0
    assert confident.run.makespan_s - static.run.makespan_s == pytest.approx(lookups_s, rel=1e-6)
    assert proposes.run.tokens_per_step < static.run.tokens_per_step


def test_route_by_a_trace_category_column(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,category\n"
                     + "".join(f"{i * 0.05},200,100,{'code' if i % 2 else 'chat'}\n" for i in range(40)))
    scenario = with_policy({"route": {"code": LOOKUP}})
    scenario["workload"] = {"arrival": "trace", "trace": str(trace)}
    result = sim.simulate(scenario)
    assert 0.3 < result.run.lookup_share < 0.7


@pytest.mark.parametrize("policy,workload,message", [
    ({"route": {"math": LOOKUP}}, {}, "speculation.policy.route: category 'math' is not among workload.categories"),
    ({"route": {"code": LOOKUP}}, {"categories": None}, "speculation.policy.route: needs request categories"),
    ({"route": {"code": {"method": "draft_model", "acceptance": {"rate": 0.5}}}}, {},
     "speculation: route code: method draft_model is neither ngram, none nor the scenario's eagle"),
    ({"route": {"code": {"method": "none", "acceptance": {"rate": 0.5}}}}, {},
     "speculation.policy.route.code: method none takes no acceptance"),
    ({"combine": {"drafter": {"method": "eagle", "acceptance": {"rate": 0.5}}}}, {},
     "speculation.policy.combine: combine's drafter is prompt lookup"),
    ({"combine": {"drafter": LOOKUP, "rule": "longest"}}, {}, "speculation.policy.combine.rule: input should be"),
    ({"combine": {"drafter": {**LOOKUP, "acceptance": {"per_position": [0.5, 0.5]}}}}, {},
     "speculation: a second drafter's acceptance.per_position has 2 rates for 4 drafts"),
    ("route", {}, "speculation.policy: route needs its drafters"),
])
def test_bad_route_or_combine_is_one_line_and_exit_2(tmp_path, policy, workload, message):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(with_policy(policy, **workload)))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("error: " + message)


def test_combine_needs_a_model_drafter_as_the_method():
    scenario = with_policy({"combine": {"drafter": LOOKUP}})
    scenario["speculation"]["method"] = "ngram"
    with pytest.raises(sim.InputError, match="combine pairs prompt lookup with a model drafter"):
        sim.load_scenario(scenario)


def test_lookup_first_on_traces_takes_lookup_where_it_matches():
    from sim.validate.oracle import conditional_rates, fitted_combine, lookup_first, walk

    model = {0: np.array([1, 1, 1, 1, 1, 1])}
    lookup = {0: np.array([4, 0, 4, 0, 0])}          # one root shorter than the model's
    match = {0: np.array([3, 1, 2, 0, 3])}
    traced = lookup_first(model, lookup, match, min_match=2)[0]
    assert traced.tolist() == [4, 1, 4, 1, 0, 1]
    assert walk(traced, 4).tolist() == [4, 1]         # root 0 takes 4 + 1 tokens, root 5 one more
    assert conditional_rates(np.array([0, 1, 2, 4]), 3) == [0.75, 2 / 3, 0.5]
    # Fitted as each drafter's own run walks: the model's steps at roots 0, 2, 4 (1 accepted each);
    # lookup's one step at root 0 (matched, 4 accepted), which ends its 5 roots.
    fits = fitted_combine(model, lookup, match, 4, 2)
    assert fits[0]["per_position"] == [1.0, 0.0, 0.0, 0.0]
    assert fits[1]["draft_share"] == 1.0 and fits[1]["per_position"] == [1.0, 1.0, 1.0, 1.0]
    lookup = {0: np.array([0, 4, 0, 0, 0])}
    match = {0: np.array([3, 1, 0, 1, 3])}            # lookup's walk: roots 0, 1 (4 accepted) -> 6: done
    fits = fitted_combine(model, lookup, match, 4, 2)
    assert fits[1]["draft_share"] == 0.5 and fits[1]["per_position"][0] == 0.0
    assert fitted_combine(model, lookup, {0: np.zeros(5, np.int64)}, 4, 2) is None


def test_prompt_lookup_match_length_is_the_longest_earlier_ngram():
    from profiler.engine.drafters import NgramDrafter

    drafter = NgramDrafter(max_ngram=3)
    assert drafter.match_length([5, 6, 7, 9, 6, 7]) == 2
    assert drafter.match_length([5, 6, 7, 5, 6, 7]) == 3
    assert drafter.match_length([1, 2, 3, 4]) == 0
    assert drafter.match_length([4]) == 0


def test_run_summary_names_the_policy_and_its_lookup_share(tmp_path):
    path = tmp_path / "route.yaml"
    path.write_text(yaml.safe_dump(with_policy({"route": {"code": LOOKUP}})))
    proc = subprocess.run([sys.executable, "-m", "sim", "run", str(path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.lstrip().startswith("policy")]
    share = float(line.split("; ")[1].split("%")[0]) / 100
    assert line.split()[1:4] == ["route", "(code:", "ngram);"] and 0.3 < share < 0.5


def test_a_lane_whose_drafter_sometimes_proposes_nothing_verifies_one_token_there():
    # Route code requests to the method with a draft share: at the steps it drafts nothing they
    # verify one token and commit one, priced as such; the steps' lengths and draws agree.
    sometimes = {"method": "eagle", "acceptance": {"tokens_per_step": 2.0, "draft_share": 0.5}}
    result = sim.simulate(with_policy({"route": {"code": sometimes, "chat": sometimes}}))
    assert result.run.tokens_per_step == pytest.approx(1.5, abs=0.03)
    assert set(result.run.tokens_per_step_histogram) == {1, 2}


def test_a_routed_category_that_draws_no_request_is_no_error():
    result = sim.simulate(with_policy({"route": {"rare": LOOKUP}}, categories={"rare": 1e-9, "chat": 1.0},
                                      requests=16))
    assert result.run.lookup_share == 0.0
