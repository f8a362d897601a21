"""tinyllm.slo: parsing --slo, judging a request, goodput and share met."""

from __future__ import annotations

import argparse

import pytest

from tinyllm.args import OneLineParser, add_slo_arg
from tinyllm.slo import SLO, SLOSummary, SLOVerdict, goodput, judge, most_waited, share_met, tpot


def test_parse_and_canonical_text():
    slo = SLO.parse("ttft=500ms,tpot=50ms")
    assert slo == SLO(ttft_s=0.5, tpot_s=0.05)
    assert str(slo) == "ttft=500ms,tpot=50ms"
    assert SLO.parse(str(slo)) == slo
    assert SLO.parse(" TPOT = 0.02s ") == SLO(tpot_s=0.02)
    assert str(SLO.parse("ttft=2s")) == "ttft=2000ms"
    assert str(SLO.parse("tpot=0.5ms")) == "tpot=0.5ms"
    for text in ("ttft=0.3s", "ttft=1.5s,tpot=7ms", "tpot=123.25ms"):
        assert SLO.parse(str(SLO.parse(text))) == SLO.parse(text)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty SLO"),
        ("  ", "empty SLO"),
        ("ttft=500", "give a unit, ms or s"),
        ("ttft=500us", "expected a number then ms or s"),
        ("latency=5s", "unknown SLO target 'latency': expected ttft or tpot"),
        ("ttft=0ms", "expected a time > 0"),
        ("ttft=-5ms", "expected a time > 0"),
        ("ttft=nanms", "expected a time > 0"),
        ("ttft=1ms,ttft=2ms", "given twice"),
        ("ttft=1ms,", "expected KEY=TIME"),
        ("ttft:500", "expected KEY=TIME"),
    ],
)
def test_parse_errors_are_one_line_and_say_what_is_allowed(text, words):
    with pytest.raises(ValueError) as e:
        SLO.parse(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_from_value_string_or_object():
    assert SLO.from_value("ttft=300ms") == SLO(ttft_s=0.3)
    assert SLO.from_value({"ttft": "300ms", "tpot": "0.05s"}) == SLO(ttft_s=0.3, tpot_s=0.05)
    for bad, words in (
        ({}, "empty SLO"),
        ({"e2e": "1s"}, "unknown SLO target(s) e2e"),
        ({"ttft": 300}, "as a string"),
        (300, "expected a string"),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            SLO.from_value(bad)


def test_slo_option_errors_on_one_line(capsys):
    p = OneLineParser(prog="x")
    add_slo_arg(p)
    assert p.parse_args(["--slo", "ttft=1s"]).slo == SLO(ttft_s=1.0)
    assert p.parse_args([]).slo is None
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--slo", "ttft=1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--slo" in err and "unit" in err
    with pytest.raises(SystemExit):
        p.parse_args(["--sl", "ttft=1s"])  # no abbreviations
    assert isinstance(p, argparse.ArgumentParser)


def test_judge_met_missed_and_the_reason_it_waited_most():
    slo = SLO(ttft_s=0.5, tpot_s=0.05)
    assert judge(slo, 0.4, 0.05, {"queue": 3}) == SLOVerdict(met=True)
    v = judge(slo, 0.6, 0.01, {"queue": 2, "pool": 5, "budget": 1})
    assert (v.met, v.missed, v.reason, v.outcome) == (False, ("ttft",), "pool", "missed")
    assert v.mark == "✗ ttft (pool)"
    v = judge(slo, 0.7, 0.2, [("slots", 4), ("queue", 4)])  # a tie: the first given
    assert v.missed == ("ttft", "tpot") and v.reason == "slots"
    assert judge(slo, 0.1, 0.2, {}).reason == ""  # slow without waiting: no reason to give
    assert judge(slo, None, None).missed == ("ttft",)  # no first token misses TTFT
    assert judge(SLO(tpot_s=0.01), 9.0, None).met  # one token: nothing to pace
    assert judge(SLO(ttft_s=0.5), 0.5, 9.9).met  # at the target is met; no TPOT target


def test_aborted_and_failed_are_counted_apart():
    slo = SLO(ttft_s=0.5)
    verdicts = [
        judge(slo, 0.1, None),
        judge(slo, 0.9, None, {"queue": 1}),
        judge(slo, 0.1, None, state="aborted"),
        judge(slo, None, None, state="failed"),
    ]
    assert [v.outcome for v in verdicts] == ["met", "missed", "aborted", "failed"]
    assert verdicts[2].mark == "aborted" and not verdicts[2].met and verdicts[2].missed == ()
    assert goodput(verdicts, 2.0) == 0.5
    assert goodput(verdicts, 0.0) == 0.0
    assert share_met(verdicts) == 0.5  # of the two finished
    assert share_met(verdicts[2:]) is None
    s = SLOSummary.of(verdicts, 2.0)
    assert (s.met, s.missed, s.aborted, s.failed, s.judged) == (1, 1, 1, 1, 2)
    assert (s.goodput, s.share_met, s.reasons) == (0.5, 0.5, (("queue", 1),))
    assert str(s) == "goodput 0.50 req/s · 1/2 met (50%) · 1 aborted · 1 failed"
    assert s.as_dict()["missed_by_reason"] == {"queue": 1}


def test_tpot_and_most_waited():
    assert tpot(1.0, 2.0, 5) == 0.25
    assert tpot(1.0, 1.0, 1) is None and tpot(None, 2.0, 5) is None
    assert most_waited({}) == "" and most_waited({"queue": 0}) == ""
    assert most_waited((("budget", 1), ("pool", 3))) == "pool"


def test_an_slo_needs_a_target():
    with pytest.raises(ValueError, match="needs a target"):
        SLO()
    with pytest.raises(ValueError, match="> 0"):
        SLO(ttft_s=0.0)


def test_the_canonical_text_has_no_exponent_and_reads_back():
    """`ttft=1000s` printed as `ttft=1e+06ms`."""
    for text, canonical in (("ttft=1000s", "ttft=1000s"), ("ttft=250s,tpot=0.3ms", "ttft=250000ms,tpot=0.3ms")):
        slo = SLO.parse(text)
        assert str(slo) == canonical and SLO.parse(str(slo)) == slo
