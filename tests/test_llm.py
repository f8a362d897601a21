"""tinyllm.LLM and SamplingParams: one call from text to text, complete results, the checkpoint's
end of text by default, flat exports, settings that do not apply refused, nothing left behind."""

import math

import numpy as np
import pytest
import torch

from tinyllm import LLM, ContinuousEngine, EngineConfig, Request, SamplingParams, generate, load_checkpoint


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=4)


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_text_in_text_out_equals_solo_generate_and_stops_at_the_checkpoints_eos(llm):
    prompts = ["ROMEO:\n", "JULIET:\n", "To be, or not"]
    out = llm.generate(prompts, greedy(48))
    assert [g.prompt for g in out] == prompts
    for g in out:
        ids = llm.tokenizer.encode(g.prompt)
        assert g.prompt_token_ids == ids
        solo = generate(llm.model, ids, 48, eos_id=0)  # generation_config.json: eos_token_id 0
        assert list(g.token_ids) == solo
        assert g.text == llm.tokenizer.decode(solo, skip_special_tokens=True)
        assert g.finish_reason == ("stop" if solo[-1] == 0 else "length")
    assert llm.eos_ids[0] == 0 and llm.engine.config == EngineConfig.best(max_num_seqs=4, seed=0)  # vLLM's seed 0


def test_prompts_as_token_ids_numpy_and_torch_arrays(llm):
    ids = [[1691, 37, 47], [26, 199, 5]]
    by_list = [g.token_ids for g in llm.generate(ids, greedy(6))]
    assert [g.token_ids for g in llm.generate(np.array(ids), greedy(6))] == by_list
    assert [g.token_ids for g in llm.generate(torch.tensor(ids), greedy(6))] == by_list
    assert llm.generate(np.array(ids[0]), greedy(6))[0].token_ids == by_list[0]  # 1-D: one prompt
    assert llm.generate(ids[1], greedy(6))[0].prompt is None


def test_a_stop_string_ends_the_request_in_the_engine_and_is_left_out(llm):
    full = llm.generate("ROMEO:\n", greedy(60))[0]
    stop = next(w for w in (",", " the", "\n") if w in full.text)
    cut = llm.generate("ROMEO:\n", greedy(60, stop=stop))[0]
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.outputs[0].stop_reason == stop
    assert len(cut.token_ids) < len(full.token_ids)
    assert llm.engine.stats.kv_allocated_at_end == 0 or llm.engine.prefix_cache  # cached blocks are free


def test_streaming_gives_the_same_text_piece_by_piece(llm):
    whole = llm.generate(["ROMEO:\n", "JULIET:\n"], greedy(20))
    pieces = {0: [], 1: []}
    finals = {}
    for d in llm.generate(["ROMEO:\n", "JULIET:\n"], greedy(20), stream=True):
        pieces[d.prompt].append(d.text)
        if d.finish_reason:
            finals[d.prompt] = d.finish_reason
    assert ["".join(pieces[i]) for i in (0, 1)] == [g.text for g in whole]
    assert finals == {0: whole[0].finish_reason, 1: whole[1].finish_reason}


def test_a_stream_closed_early_leaves_nothing_running(llm):
    stream = llm.generate(["ROMEO:\n"] * 3, greedy(50), stream=True)
    next(stream)
    stream.close()
    assert not llm.engine.has_work() and not llm.engine.results


def test_samples_seeds_and_logprobs(llm):
    s = SamplingParams(temperature=0.9, max_tokens=12, seed=7, n=3, logprobs=2)
    a, b = llm.generate("ROMEO:\n", s)[0], llm.generate("ROMEO:\n", s)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]  # seeded: repeatable
    assert [c.index for c in a.outputs] == [0, 1, 2]
    for c in a.outputs:
        assert len(c.logprobs) == len(c.token_ids) and all(2 <= len(lp) <= 3 for lp in c.logprobs)
        assert [next(iter(lp)) for lp in c.logprobs] == c.token_ids  # the chosen token first, as vLLM
    assert llm.generate("ROMEO:\n", greedy(3))[0].logprobs is None


def test_end_of_text_ends_a_request_unless_ignore_eos(llm):
    """The bundled model seldom writes its EOS, so this takes a token greedy decoding writes as
    the checkpoint's end of text, as a generation_config.json naming it would."""
    free = llm.generate("ROMEO:\n", greedy(30, ignore_eos=True))[0]
    eos = free.token_ids[9]
    first = free.token_ids.index(eos)
    saved, llm.eos_ids = llm.eos_ids, (eos,)
    try:
        ended = llm.generate("ROMEO:\n", greedy(30))[0]
        ignored = llm.generate("ROMEO:\n", greedy(30, ignore_eos=True))[0]
    finally:
        llm.eos_ids = saved
    assert ended.token_ids == free.token_ids[: first + 1] and ended.finish_reason == "stop"
    assert ended.outputs[0].stop_reason is None  # EOS: None, as vLLM (a stop token id: the id)
    assert ignored.token_ids == free.token_ids and ignored.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_tokens=0), "max_tokens must be an integer >= 1 or None, got 0"),
        (dict(max_tokens=-1), "max_tokens must be an integer >= 1 or None, got -1"),
        (dict(top_k=-3), "top_k must be an integer >= 1, or 0 / -1"),
        (dict(temperature=-1), "temperature must be a finite number >= 0"),
        (dict(min_tokens=20, max_tokens=10), r"min_tokens must be an integer from 0 to max_tokens \(10\)"),
        (dict(n=0), "n must be an integer from 1 to 16"),
        (dict(ignore_eos="yes"), "ignore_eos must be True or False"),
    ],
)
def test_sampling_params_refuse_by_the_name_the_user_gave(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts_are_refused_and_nothing_is_left_in_the_engine(llm):
    with pytest.raises(ValueError, match="prompt 1 must be a string or a non-empty list of token ids"):
        llm.generate(["ROMEO:", [1, -2]])
    with pytest.raises(ValueError, match="prompt 1: prompt is 600 tokens"):
        llm.generate([[5] * 4, [5] * 600], greedy(4))
    with pytest.raises(
        ValueError, match=r"sampling_params must be one SamplingParams or a list of one per prompt \(2\)"
    ):
        llm.generate(["a", "b"], [greedy(3)])
    assert not llm.engine.has_work() and not llm.engine.results


def test_every_request_ends_with_a_result_and_the_engine_fills_its_own_stats():
    """Driven by hand (a step loop), an aborted request has a Result too, and Stats are real."""
    model, _ = load_checkpoint()
    eng = ContinuousEngine(model, config=EngineConfig.best(max_num_seqs=2))
    done = eng.add_request(Request([5, 6, 7] * 10, 8, logprobs=1))
    dropped = eng.add_request(Request([5, 6, 7] * 10, 30))
    eng.step()
    eng.step()
    assert eng.abort(dropped)
    while eng.has_work():
        eng.step()
    again = eng.add_request(Request([5, 6, 7] * 10, 4))  # the same prompt: its prefix is cached
    while eng.has_work():
        eng.step()
    assert eng.results[again].tokens == eng.results[done].tokens[:4]
    r, a = eng.results[done], eng.results[dropped]
    assert (r.rid, r.state, r.finish_reason, len(r.logprobs)) == (done, "finished", "length", 8)
    assert (a.rid, a.state, a.finish_reason, a.error) == (dropped, "aborted", "abort", None)
    assert 0 < len(a.tokens) < 30 and not math.isnan(a.ttft_s)
    st = eng.stats
    assert st.wall_s > 0 and st.prefix_cache_queries > 0 and st.prefix_cache_hits > 0
    assert st.kv_allocated_at_end == 0
    assert st.summary([r])["tok_s"] > 0


def test_the_flat_exports():
    import tinyllm

    for name in (
        "LLM",
        "SamplingParams",
        "EngineConfig",
        "generate",
        "load_checkpoint",
        "Transformer",
        "ContinuousEngine",
        "Request",
        "Result",
    ):
        assert getattr(tinyllm, name) is not None and name in dir(tinyllm)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tinyllm.nope


def test_request_and_generate_take_numpy_ids_and_refuse_what_the_user_set():
    """NumPy ids were refused (`got np.int64(1691)`); Request(prompt, -1) blamed min_tokens, which
    the user never set; generate(model, prompt, 0) returned [] silently."""
    from tests.helpers import random_model

    model = random_model()
    ids = np.array([5, 6, 7])
    assert Request(ids, 4).prompt == [5, 6, 7] and Request([np.int64(5)], 2).prompt == [5]
    assert generate(model, ids, 4) == generate(model, [5, 6, 7], 4) == generate(model, torch.tensor([5, 6, 7]), 4)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got -1"):
        Request([5], -1)
    for n in (0, -1):
        with pytest.raises(ValueError, match=f"max_new_tokens must be an integer >= 1, got {n}"):
            generate(model, [5, 6], n)
    with pytest.raises(ValueError, match="prompt token ids must be integers >= 0"):
        generate(model, [5, -6], 3)
