"""`tinyllm bench --slo`: each path's goodput and share met, in its JSON and its table, each
request judged by its workload line's own SLO where it has one. Nothing here asserts a speed:
the SLOs are set so that the outcomes do not depend on the machine."""

from __future__ import annotations

import pytest

from tests.test_bench import render, run_tiny
from tinyllm import cli

# Line 0 meets the run's TTFT of 1000 s; line 1's own TPOT of a microsecond no step keeps; line 2
# has no SLO of its own: the run's.
LINES = (
    '{"prompt": "ROMEO: speak", "max_new_tokens": 6, "slo": "ttft=1000s"}\n'
    '{"prompt": "JULIET: speak", "max_new_tokens": 6, "slo": {"tpot": "0.001ms"}}\n'
    '{"prompt": "HAMLET: be", "max_new_tokens": 6}\n'
)


@pytest.fixture(scope="module")
def slo_bench(tmp_path_factory):
    wl = tmp_path_factory.mktemp("wl") / "slo.jsonl"
    wl.write_text(LINES)
    return run_tiny(tmp_path_factory, "--workload", str(wl), "--slo", "ttft=1000s")


def test_each_path_has_its_goodput_and_share_met_in_the_json(slo_bench):
    _, _, report = slo_bench
    assert report["slo"] == "ttft=1000s" and report["slo_judged"]
    for table in ("paths", "paths_equal_slots"):
        for path, fig in report[table].items():
            if path == "solo":
                continue
            s = fig["slo"]
            assert (s["met"], s["missed"], s["aborted"], s["failed"]) == (2, 1, 0, 0), path
            assert s["share_met"] == pytest.approx(2 / 3, abs=1e-6)
            assert s["goodput_rps"] == pytest.approx(2 / fig["wall_s"], rel=1e-5)
    assert report["paths"]["solo"].get("slo") is None  # a sample run one by one: not judged


@pytest.mark.parametrize("width", [80, 400])
def test_the_table_shows_goodput_and_share_met(slo_bench, width):
    _, _, report = slo_bench
    text = render(report, width)
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    heads = [[c.strip() for c in line.strip("┃").split("┃")] for line in text.splitlines() if line.startswith("┃")]
    assert any("goodput" in h for h in heads) and any("SLO met" in h for h in heads)
    for path, fig in report["paths"].items():
        cells = [c for r in rows if r[0] == path for c in r[1:]]
        want = "—" if path == "solo" else f"{fig['slo']['goodput_rps']:.2f}/s"
        assert want in cells and ("—" if path == "solo" else "2/3 (67%)") in cells, path
    assert "goodput: requests per second that met --slo ttft=1000s" in text


def test_a_bad_slo_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--slo", "ttft=5"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "give a unit, ms or s" in err
