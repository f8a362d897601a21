"""N-gram speculative decoding (tinyllm/engine/speculate.py): drafts found by prompt lookup,
verified in the step's one mixed forward, accepted or rolled back. Greedy output is identical,
token for token, to decoding without speculation; only requests whose token is their logits'
argmax are drafted; stop rules hold mid-draft; no block outlives a draft. (The engine fuzz in
tests/test_kv_budget.py runs random schedules with drafts too.)"""

from __future__ import annotations

import pytest

from tinyllm import LLM, ContinuousEngine, EngineConfig, Request, SamplingParams, generate
from tinyllm.engine.speculate import propose_ngram
from tinyllm.request import Sampling

REPEATING = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun.\n"


def test_the_proposer_continues_the_latest_earlier_match_of_the_longest_suffix():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert propose_ngram(ctx, 2, 1, 3) == [7, 8]  # "1 2 3" last seen before 7 8
    assert propose_ngram(ctx, 5, 1, 3) == [7, 8, 1, 2, 3]  # up to k, as far as the context goes
    assert propose_ngram([5, 6, 7], 3, 1, 3) == []  # nothing repeats
    assert propose_ngram([4, 5, 4], 2, 1, 1) == [5, 4]  # a one-token suffix
    assert propose_ngram(ctx, 0) == [] and propose_ngram([1], 3) == []


def run(model, reqs: list[Request], **config) -> tuple[list[list[int]], ContinuousEngine]:
    eng = ContinuousEngine(model, config=EngineConfig.best(max_num_seqs=4, **config))
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
    return [eng.results.pop(r).tokens for r in rids], eng


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_with_drafts_equals_solo_and_drafts_are_both_kept_and_rolled_back(model_tok, k):
    model, tok = model_tok
    prompts = [tok.encode(REPEATING * 2), tok.encode("JULIET:\n"), tok.encode("To be, or not to be:\n" * 3)]
    reqs = [Request(p, 48) for p in prompts]
    outs, eng = run(model, reqs, num_speculative_tokens=k, block_size=4)  # (small blocks: drafts spill)
    assert outs == [generate(model, p, 48) for p in prompts]
    st = eng.stats
    assert st.spec_drafts > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens  # kept and rejected
    assert len(st.spec_accepted_per_pos) == k and st.spec_accepted_per_pos == sorted(
        st.spec_accepted_per_pos, reverse=True
    )
    assert st.kv_allocated_at_end == 0 and eng.slots.num_free_blocks() == eng.slots.n_blocks


def test_the_stop_rules_hold_mid_draft(model_tok):
    model, tok = model_tok
    ids = tok.encode(REPEATING * 2)
    free = generate(model, ids, 40)
    eos, stop = free[12], free[20]
    reqs = [Request(ids, 40, eos_id=eos), Request(ids, 40, stop_token_ids=(stop,)), Request(ids, 7)]
    outs, _ = run(model, reqs, num_speculative_tokens=4)
    assert outs[0] == generate(model, ids, 40, eos_id=eos) and outs[0][-1] == eos
    assert outs[1] == free[: free.index(stop) + 1] and outs[2] == free[:7]


def test_seeded_penalized_and_logprobs_requests_are_not_drafted_and_unchanged(model_tok):
    model, tok = model_tok
    ids = tok.encode(REPEATING * 2)
    sampled = [
        Request(ids, 24, sampling=Sampling(temperature=0.8, seed=3)),
        Request(ids, 24, sampling=Sampling(repetition_penalty=1.3)),  # greedy with a penalty
        Request(ids, 24, logprobs=1),
    ]
    with_spec, eng = run(model, sampled, num_speculative_tokens=4)
    without, _ = run(model, sampled)
    assert with_spec == without and eng.stats.spec_drafts == 0


def test_speculation_is_configured_as_vllm_and_checked(model_tok):
    with pytest.raises(ValueError, match="num_speculative_tokens needs chunked_prefill=True"):
        EngineConfig(num_speculative_tokens=2)
    with pytest.raises(ValueError, match="num_speculative_tokens must be an integer from 0"):
        EngineConfig.best(num_speculative_tokens=-1)
    llm = LLM(
        max_num_seqs=2, speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    )
    c = llm.engine.config
    assert (c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == (3, 4, 1)
    out = llm.generate(REPEATING * 2, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)[0]
    model, tok = model_tok
    assert out.token_ids == generate(model, tok.encode(REPEATING * 2), 32, eos_id=0)
    with pytest.raises(ValueError, match="method 'eagle' is not supported"):
        LLM(speculative_config={"method": "eagle", "num_speculative_tokens": 3})


def test_speculation_turns_itself_off_where_the_batch_is_large(model_tok):
    """Verifying drafts costs tokens a large batch has no spare compute for (0.5-0.7x at 16-64
    sequences on the 2-core CPU): from disable_by_batch_size decoding sequences, no drafts."""
    model, tok = model_tok
    reqs = [Request(tok.encode(REPEATING * 2), 24) for _ in range(4)]
    outs, eng = run(model, reqs, num_speculative_tokens=4, speculative_disable_by_batch_size=3)
    assert outs == [generate(model, r.prompt, 24) for r in reqs]
    assert eng.scheduler.spec_off_steps > 0 and eng.stats.spec_drafts == 0  # four decode: off every step
    _, few = run(model, reqs[:2], num_speculative_tokens=4, speculative_disable_by_batch_size=3)
    assert few.stats.spec_drafts > 0 and few.scheduler.spec_off_steps == 0


def test_the_server_takes_the_flag_and_reports_vllms_spec_decode_series(model_tok, monkeypatch, capsys):
    import httpx

    import tinyllm.serve.server as server_mod
    from tests.helpers import SERVED_MODEL, serve_in_thread
    from tinyllm.cli import main

    got = {}
    monkeypatch.setattr(
        server_mod, "run_server", lambda engine, tok, name, sock, **kw: got.update(e=engine) or sock.close()
    )
    main(["serve", "--port", "0", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert got["e"].config.num_speculative_tokens == 3
    server = serve_in_thread(*model_tok, slots=2, num_speculative_tokens=4)
    try:
        body = {"model": SERVED_MODEL, "prompt": REPEATING * 2, "max_tokens": 32, "temperature": 0}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    series = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:spec")
    }
    assert series["vllm:spec_decode_num_drafts_total"] > 0
    assert 0 < series["vllm:spec_decode_num_accepted_tokens_total"] <= series["vllm:spec_decode_num_draft_tokens_total"]
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="' in metrics and 'position="0"' in metrics


async def test_the_app_shows_speculation_and_the_acceptance_the_snapshot_holds(model_tok):
    import torch

    from tests.test_app import step, submit, until, watched_app

    model, tok = model_tok
    eng = ContinuousEngine(
        model,
        2,
        256,
        kv="paged",
        block_size=8,
        generator=torch.Generator().manual_seed(0),
        chunked_prefill=True,
        max_batched_tokens=64,
        num_speculative_tokens=4,
    )
    app = watched_app(eng, tok, 40, settings=None)
    async with app.run_test(size=(120, 36)) as pilot:
        assert "spec k=4 ngram" in app.query_one("#status").render().plain
        rid = await submit(pilot, REPEATING * 2)
        for _ in range(60):  # step until a step verifies a draft of it: the pane says so, mark by mark
            await step(pilot)
            v = app.runner.frame.snapshot.request(rid)
            if v.last_draft and v.last_draft_step == app.runner.frame.snapshot.counters.steps:
                break
        await until(pilot, lambda: "a draft of" in app.query_one("#pane-body").render().plain, what="the pane")
        from tui.widgets.kv_panel import rolled_back

        rolled = rolled_back(app.runner.frame.snapshot)
        assert rolled == v.last_draft - v.last_kept  # (one request: its rejected tail)
        shown = " ".join(app.query_one("#kv").render().plain.split())
        assert (f"rolled back {rolled}" in shown) == (rolled > 0), shown
        pane = app.query_one("#pane-body").render().plain
        marks = "✓" * v.last_kept + "✗" * (v.last_draft - v.last_kept)
        assert f"a draft of {v.last_draft}: {marks} {v.last_kept} kept, then its own next token" in pane, pane
        assert f"drafts kept {v.spec_kept} of {v.spec_drafted}" in pane
        assert v.spec_drafts >= 1 and f"{1 + v.spec_kept / v.spec_drafts:.2f} tokens a drafted step" in pane
        grid = app.query_one("#slots").render().plain  # its slot's cell marks the step's draft
        assert f"#{rid:<3}»" in grid, grid
        track = next(t for t in app.runner.frame.tracks if t.rid == rid)  # and the timeline's row
        assert v.last_draft_step in track.draft_steps
        await step(pilot, 60)
        await until(pilot, lambda: not app.runner.frame.snapshot.busy, what="the request to finish")
        c = app.runner.frame.snapshot.counters
        assert c.spec_draft_tokens > 0
        shown = " ".join(app.query_one("#kv").render().plain.split())
        assert f"drafts kept {c.spec_accepted_tokens / c.spec_draft_tokens:.0%}" in shown, shown
        assert not [n for n in app._notifications if n.severity == "error"]


def test_a_race_lane_pair_speculation_off_and_on_gives_the_same_tokens(model_tok):
    """ "chunked" against "chunked spec=4": the same greedy tokens; the speculating lane's engine
    drafted (on the cost clock the verify pass's extra tokens are priced as any other token)."""
    from tests.helpers import race_run
    from tinyllm.race.race import build_race
    from tinyllm.race.spec import LaneSpecError, parse_lanes

    model, tok = model_tok
    work = [(0.0, Request(tok.encode(REPEATING * 2), 24)), (0.0, Request(tok.encode("JULIET:\n"), 24))]
    race = build_race(model, work, race_run(2, 256), lanes=parse_lanes(["chunked", "chunked spec=4"]), step_cost_s=0.01)
    while race.step() is not None:
        pass
    off, on = race.lanes
    tokens = [sorted((rid, r.tokens) for rid, r in lane.engine.results.items()) for lane in (off, on)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 2
    assert on.engine.stats.spec_drafts > 0 and off.engine.stats.spec_drafts == 0
    assert "speculation k=4" in on.detail
    with pytest.raises(LaneSpecError, match="spec need chunked prefill"):
        parse_lanes(["continuous spec=2"])


def test_tinyllm_bench_passes_the_speculative_config_to_the_token_budget_paths():
    from argparse import Namespace

    from tinyllm.bench.run import path_settings
    from tinyllm.engine_args import speculative_arg

    args = Namespace(
        scheduling_policy="fcfs",
        kv_cache_dtype="auto",
        max_batched_tokens=64,
        slots=4,
        speculative_config=speculative_arg('{"method": "ngram", "num_speculative_tokens": 2}'),
    )
    assert path_settings("continuous-chunked", "slots", args, 0, 128)["num_speculative_tokens"] == 2
    assert "num_speculative_tokens" not in path_settings("continuous-paged", "slots", args, 0, 128)


def test_sampled_drafts_keep_the_requests_own_distribution():
    """Temperature > 0: rejection sampling keeps each position's distribution. Every vocabulary
    token is in the prompt, so after the first token (drawn at the prefill) every decode has a
    draft; the second token's frequencies over 2,560 draws match its exact marginal from the
    model (the sum over first tokens of p(t1) p(t2 | t1)), as they do without speculation."""
    import torch

    from tests.helpers import random_model

    model = random_model(seed=3, vocab=16, d_model=32, n_layers=1, max_seq_len=64)
    prompt = [*range(16), 3, 1, 4, 1, 5, 9, 2, 6]

    def draws(spec: int) -> tuple[list[int], int, int]:
        seconds, drafts, kept = [], 0, 0
        for run_seed in range(40):
            eng = ContinuousEngine(
                model,
                config=EngineConfig.best(
                    max_num_seqs=64, num_speculative_tokens=spec, speculative_disable_by_batch_size=None, max_len=64
                ),
                generator=torch.Generator().manual_seed(run_seed),
            )
            rids = [eng.add_request(Request(prompt, 4, sampling=Sampling(temperature=1.0))) for _ in range(64)]
            while eng.has_work():
                eng.step()
            seconds += [eng.results[r].tokens[1] for r in rids]
            drafts, kept = drafts + eng.stats.spec_draft_tokens, kept + eng.stats.spec_accepted_tokens
        return seconds, drafts, kept

    with torch.no_grad():
        first = torch.softmax(model(torch.tensor([prompt]))[0][0, -1].double(), -1)
        after = torch.softmax(model(torch.tensor([[*prompt, t] for t in range(16)]))[0][:, -1].double(), -1)
    exact = (first[:, None] * after).sum(0)  # the second token's marginal
    freq = lambda xs: torch.bincount(torch.tensor(xs), minlength=16).double() / len(xs)  # noqa: E731
    tv = lambda a, b: 0.5 * (a - b).abs().sum().item()  # noqa: E731 - total variation distance
    seconds, drafts, kept = draws(2)
    plain, _, _ = draws(0)
    assert drafts >= 64 * 40 and 0 < kept < drafts  # drafts at every decode, some kept, some not
    assert tv(freq(seconds), exact) < 0.06, tv(freq(seconds), exact)
    assert tv(freq(plain), exact) < 0.06  # (the same bound holds without drafts)


def test_a_draft_model_batch_proposes_what_each_request_would_alone(model_tok):
    """Rows of different lengths share one left-padded batch: each row's guesses are the ones it
    gets alone (padding never leaks into a row), and each draft stops at its own room."""
    from tinyllm.engine.draft_model import DraftModelProposer

    model, tok = model_tok
    proposer = DraftModelProposer(model, window=16)
    asks = [(tok.encode(REPEATING), 4), (tok.encode("JULIET:\n"), 2), (tok.encode("To be, or not"), 0)]
    together = proposer.propose(asks)
    alone = [proposer.propose([ask])[0] for ask in asks]
    assert together == alone and [len(d) for d in together] == [4, 2, 0]
    ctx = tok.encode("JULIET:\n")  # the guesses are the model's own greedy tokens
    assert together[1] == generate(model, ctx, 2)


def test_a_draft_model_is_exact_and_a_perfect_draft_is_always_kept(model_tok):
    """The model as its own draft, over the whole context, guesses exactly what it says: every
    draft kept. The bundled draft model guesses less well: drafts kept and rolled back, and the
    output token for token the same as without speculation, no block left behind."""
    from tinyllm.model.checkpoint import BUNDLED_MODEL

    model, tok = model_tok
    prompts = [tok.encode(REPEATING * 2), tok.encode("JULIET:\n"), tok.encode("To be, or not to be:\n" * 3)]
    reqs = [Request(p, 40) for p in prompts]
    solo = [generate(model, p, 40) for p in prompts]
    eng = ContinuousEngine(
        model,
        config=EngineConfig.best(
            max_num_seqs=4, num_speculative_tokens=4, speculative_model=str(BUNDLED_MODEL), block_size=4
        ),
    )
    eng.scheduler.proposer.window = 512  # the whole context: the draft is the model itself
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
    assert [eng.results.pop(r).tokens for r in rids] == solo
    st = eng.stats
    assert st.spec_drafts > 0 and st.spec_accepted_tokens == st.spec_draft_tokens  # every guess kept
    outs, eng = run(model, reqs, num_speculative_tokens=4, speculative_model="tinyllm-shakespeare-draft", block_size=4)
    assert outs == solo
    st = eng.stats
    assert type(eng.scheduler.proposer).__name__ == "DraftModelProposer"
    assert st.spec_drafts > 0 and 0 < st.spec_accepted_tokens < st.spec_draft_tokens  # kept and rolled back
    assert st.kv_allocated_at_end == 0 and eng.slots.num_free_blocks() == eng.slots.n_blocks


def test_a_draft_model_is_configured_as_vllm_and_checked(model_tok, tmp_path):
    from tinyllm.config import speculative_settings
    from tinyllm.model.checkpoint import BUNDLED_MODEL, save_checkpoint
    from tinyllm.model.config import ModelConfig
    from tinyllm.model.transformer import Transformer

    # vLLM's inference of the method: a model other than "ngram" is a draft model
    assert speculative_settings({"model": "d", "num_speculative_tokens": 2}) == {
        "num_speculative_tokens": 2,
        "speculative_model": "d",
    }
    assert "speculative_model" not in speculative_settings({"model": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="'draft_model' needs model"):
        speculative_settings({"method": "draft_model", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="prompt_lookup_max not supported with method 'draft_model'"):
        speculative_settings({"model": "d", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    model, _ = model_tok
    with pytest.raises(ValueError, match="speculative_config model '/no/such/dir'"):
        LLM(speculative_config={"model": "/no/such/dir", "num_speculative_tokens": 2})
    other = Transformer(ModelConfig(vocab_size=4160, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64))
    save_checkpoint(other, tmp_path, tokenizer_dir=BUNDLED_MODEL)  # (a vocabulary padded to 4,160)
    with pytest.raises(ValueError, match="a vocabulary of 4,160 tokens, the model 4,096: a draft model must share"):
        ContinuousEngine(model, config=EngineConfig.best(num_speculative_tokens=2, speculative_model=str(tmp_path)))
    with pytest.raises(ValueError, match="speculative_model needs num_speculative_tokens"):
        EngineConfig.best(speculative_model=str(tmp_path))


def test_whatif_races_a_draft_model_lane_against_no_speculation(tmp_path, capsys):
    """whatif --speculative-config says how spec=N lanes draft: here the bundled draft model, on the
    wall clock (the cost clock's profile does not price a draft model's passes). The speculating
    lane's detail names its drafter."""
    import json

    from tests.test_cost_clock import PROFILE
    from tinyllm.cli import main

    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"prompt": REPEATING * 2, "max_new_tokens": 16}) + "\n" for _ in range(2)))
    out = tmp_path / "w.json"
    spec = '{"model": "tinyllm-shakespeare-draft", "num_speculative_tokens": 3}'
    args = ["whatif", str(wl), "--lanes", "chunked", "chunked spec=3", "--speculative-config", spec]
    assert main([*args, "--cost-profile", str(PROFILE)]) == 2  # the cost clock would not price the draft's passes
    assert "race a draft model with --clock wall" in capsys.readouterr().err
    assert main([*args, "--clock", "wall", "--json", str(out)]) == 0
    assert "clock: wall" in capsys.readouterr().out
    off, on = json.loads(out.read_text())["lanes"]
    assert on["detail"].endswith("speculation k=3 by the draft model tinyllm-shakespeare-draft"), on["detail"]
    assert "speculation" not in off["detail"] and on["decode_steps"] < off["decode_steps"]  # drafts kept: fewer steps
    assert main(["whatif", str(wl), "--lanes", "chunked", "fcfs", "--speculative-config", spec]) == 2
    assert "no lane has one: add one, e.g. --lanes chunked 'chunked spec=4'" in capsys.readouterr().err


def test_the_shipped_draft_model_guesses_the_bundled_model_better_than_lookup(model_tok):
    """The shipped draft (distilled from the bundled model) keeps more of its drafts than n-gram
    lookup does on prompts that hold nothing to look up: what a draft model is for."""
    model, tok = model_tok
    reqs = [Request(tok.encode(p), 32) for p in ("ROMEO:\n", "JULIET:\n", "First Citizen:\n")]
    kept = {}
    for name, extra in (("ngram", {}), ("draft", {"speculative_model": "tinyllm-shakespeare-draft"})):
        outs, eng = run(model, reqs, num_speculative_tokens=4, **extra)
        assert outs == [generate(model, r.prompt, 32) for r in reqs]
        kept[name] = eng.stats.spec_accepted_tokens / max(1, eng.stats.spec_draft_tokens)
    assert kept["draft"] > kept["ngram"], kept


def test_a_failing_proposer_costs_its_drafts_not_the_step_and_a_tight_budget_cuts_drafts(model_tok):
    """A draft model whose pass fails (out of memory, say) drafts nothing that step and the
    scheduler says why; the requests go on, token for token as without speculation. With a token
    budget of the decodes plus 3, drafts are cut in order to what the budget leaves."""
    model, tok = model_tok
    reqs = [Request(tok.encode(REPEATING * 2), 16), Request(tok.encode("To be, or not to be:\n" * 3), 16)]
    solo = [generate(model, r.prompt, 16) for r in reqs]

    class Failing:
        method = "draft_model"

        def propose(self, asks):
            raise RuntimeError("out of memory")

    eng = ContinuousEngine(model, config=EngineConfig.best(max_num_seqs=4, num_speculative_tokens=4))
    eng.scheduler.proposer = Failing()
    rids = [eng.add_request(r) for r in reqs]
    while eng.has_work():
        eng.step()
    assert [eng.results.pop(r).tokens for r in rids] == solo
    assert eng.stats.spec_drafts == 0 and eng.scheduler.proposer_error == "RuntimeError: out of memory"
    from tui.widgets.status import settings_fields

    said = "".join(text for text, _, _ in settings_fields(eng.snapshot(), ""))  # the status line's words
    assert "drafts failed: RuntimeError: out of memory" in said, said
    eng = ContinuousEngine(
        model, config=EngineConfig.best(max_num_seqs=4, num_speculative_tokens=4, max_batched_tokens=5)
    )
    rids = [eng.add_request(r) for r in reqs]
    widest = 0
    while eng.has_work():
        eng.step()
        widest = max(widest, sum(n for _, n in eng.snapshot().batch))
    assert [eng.results.pop(r).tokens for r in rids] == solo
    assert eng.stats.spec_drafts > 0 and widest == 5  # two decodes and 3 draft tokens, never more


def test_tinyllm_bench_says_what_each_speculating_paths_drafts_did():
    """Under its table, bench names the proposer, the drafts kept and the mean accepted length of
    each token-budget path, or why it drafted nothing; without --speculative-config, nothing."""
    from tinyllm.bench.report import speculation_lines

    figures = {"spec_drafts": 78, "spec_draft_tokens": 155, "spec_accepted_tokens": 99}
    report = {
        "speculative": {"num_speculative_tokens": 2, "speculative_model": "tinyllm-shakespeare-draft"},
        "paths": {"static": {}, "continuous-chunked": figures, "continuous-chunked-nocache": {"spec_draft_tokens": 0}},
    }
    first, second = speculation_lines(report, "paths")
    assert first == (
        "continuous-chunked: speculation by the draft model tinyllm-shakespeare-draft, k=2: drafts kept 99 of "
        "155 tokens (64%) in 78 drafts, 2.27 tokens a drafted step"
    )
    assert "nothing drafted (off in steps of 4 decoding sequences or more;" in second
    assert speculation_lines({**report, "speculative": None}, "paths") == []
