"""tinyllm.LLM as a vLLM user meets it: vLLM's example scripts with the import changed, every
attribute a script reads (vLLM 0.32's names and types), outputs equal to the engine's own, the
defects the port found, and one LLM used from several threads and streams at once."""

import contextlib
import io
import math
import runpy
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tinyllm import LLM, ContinuousEngine, EngineConfig, Request, SamplingParams, generate
from tinyllm.model.checkpoint import BUNDLED_MODEL
from tinyllm.outputs import CompletionOutput, Logprob, RequestOutput
from tinyllm.request import SamplingError

EXAMPLES = Path(__file__).parent / "data" / "vllm_examples"
PROMPTS = ["ROMEO:\n", "JULIET:\n", "To be, or not", "First Citizen:\n"]


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=8)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def run_example(name: str, **kw) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        scope = runpy.run_path(str(EXAMPLES / name))
        scope["main"](**kw) if "main" in scope else None
    return printed.getvalue()


def test_vllms_basic_example_runs_with_its_import_changed():
    printed = run_example("basic.py")
    prompts = [line.split("Prompt:", 1)[1].strip() for line in printed.splitlines() if line.startswith("Prompt:")]
    outputs = [line.split("Output:", 1)[1].strip() for line in printed.splitlines() if line.startswith("Output:")]
    assert prompts == [repr(p) for p in runpy.run_path(str(EXAMPLES / "basic.py"))["prompts"]]
    assert len(outputs) == 4 and all(len(eval(o)) > 0 for o in outputs)  # 16 tokens each: some text


def test_vllms_chat_example_runs_and_renders_the_checkpoints_template(tmp_path, llm):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>")
    printed = run_example("chat.py", chat_template_path=str(template))
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    rendered = llm.get_tokenizer().apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    shown = [line for line in printed.splitlines() if line.startswith("Generated text:")]
    assert printed.count(f"Prompt: {rendered!r}") == 11  # one conversation, then ten
    assert f"Prompt: {template.read_text()[:0]}'<system>You are a helpful assistant" in printed  # its own template
    assert len(shown) == 21 and len(set(shown[:11])) == 1  # greedy: the batch of ten equals the one
    ids = llm.get_tokenizer().apply_chat_template(conversation, add_generation_prompt=True)
    out = llm.chat(conversation, greedy(16), use_tqdm=False)[0]
    assert out.prompt == rendered and out.prompt_token_ids == ids
    assert out.token_ids == generate(llm.model, ids, 16, eos_id=0)


def test_every_attribute_a_vllm_script_reads(llm):
    sp = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, stop_token_ids=[np.int64(5)])
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.n, sp.logprobs, sp.seed) == (
        12,
        0.0,
        1.0,
        0,
        1,
        3,
        None,
    )
    assert (sp.stop, sp.stop_token_ids, sp.prompt_logprobs, sp.detokenize) == (None, [5], None, True)
    assert (sp.skip_special_tokens, sp.include_stop_str_in_output, sp.ignore_eos, sp.min_tokens) == (
        True,
        False,
        False,
        0,
    )
    other = sp.clone()
    other.max_tokens = 5
    assert sp.max_tokens == 12 and other.max_tokens == 5 and other.logprobs == 3

    outs = llm.generate(PROMPTS[:2], sampling_params=sp, use_tqdm=False)
    assert [type(o) for o in outs] == [RequestOutput, RequestOutput]
    assert outs[0].request_id != outs[1].request_id and all(isinstance(o.request_id, str) for o in outs)
    tok = llm.get_tokenizer()
    for o, prompt in zip(outs, PROMPTS):
        assert (o.prompt, o.prompt_token_ids, o.prompt_logprobs, o.finished) == (prompt, tok.encode(prompt), None, True)
        c = o.outputs[0]
        assert isinstance(c, CompletionOutput) and c.index == 0 and c.finished()
        assert isinstance(c.token_ids, list) and len(c.token_ids) <= 12
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason in ("stop", "length") and len(c.logprobs) == len(c.token_ids)
        for tid, position in zip(c.token_ids, c.logprobs):
            chosen = position[tid]  # vLLM: one dict per position, token id -> Logprob
            assert isinstance(chosen, Logprob) and chosen.rank >= 1
            assert chosen.decoded_token == tok.decode([tid])
            ranks = sorted(lp.rank for t, lp in position.items() if t != tid or lp.rank <= 3)
            assert ranks[:3] == [1, 2, 3] and len(position) in (3, 4)
        assert math.isclose(c.cumulative_logprob, sum(p[t].logprob for t, p in zip(c.token_ids, c.logprobs)))
    none = llm.generate(PROMPTS[0], greedy(3), use_tqdm=False)[0].outputs[0]
    assert none.logprobs is None and none.cumulative_logprob is None  # as vLLM without logprobs


def test_greedy_outputs_and_logprobs_equal_the_engines_own_batched_and_solo(llm):
    sp = greedy(16, logprobs=2)
    batched = llm.generate(PROMPTS, sp, use_tqdm=False)
    solo = [llm.generate(p, sp, use_tqdm=False)[0] for p in PROMPTS]
    eng = ContinuousEngine(llm.model, config=EngineConfig.best(max_num_seqs=8))
    tok = llm.get_tokenizer()
    rids = [eng.add_request(Request(tok.encode(p), 16, eos_id=0, logprobs=2)) for p in PROMPTS]
    while eng.has_work():
        eng.step()
    for rid, b, s, p in zip(rids, batched, solo, PROMPTS):
        own = eng.results[rid]
        assert (
            b.outputs[0].token_ids
            == s.outputs[0].token_ids
            == own.tokens
            == generate(llm.model, tok.encode(p), 16, eos_id=0)
        )
        mine = [pos[t].logprob for t, pos in zip(b.outputs[0].token_ids, b.outputs[0].logprobs)]
        assert mine == pytest.approx([lp.logprob for lp in own.logprobs], abs=1e-5)
        assert b.outputs[0].cumulative_logprob == pytest.approx(sum(mine))


def test_prompt_logprobs_are_the_models_own(llm):
    out = llm.generate(PROMPTS[2], greedy(2, prompt_logprobs=2), use_tqdm=False)[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        logits, _ = llm.model(torch.tensor([ids]))
    lp = torch.log_softmax(logits[0].double(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for i in range(1, len(ids)):
        pos = out.prompt_logprobs[i]
        want = lp[i - 1, ids[i]].item()
        assert pos[ids[i]].logprob == pytest.approx(want, abs=1e-4)
        assert pos[ids[i]].rank == int((lp[i - 1] > lp[i - 1, ids[i]]).sum()) + 1
        top = torch.topk(lp[i - 1], 2).indices.tolist()
        assert all(t in pos for t in top)


# -- the defects the port found, each as it was reported ----------------------------------------
def test_a_stop_string_completed_by_the_last_allowed_token_says_stop_in_both_forms(llm):
    """It said "length" when generated whole and "stop" when streamed (the engine had ended the
    request at max_tokens before the stop string was seen)."""
    full = llm.generate(PROMPTS[0], greedy(12), use_tqdm=False)[0].outputs[0]
    stop = next(
        full.text[-k:] for k in range(1, len(full.text)) if full.text.find(full.text[-k:]) == len(full.text) - k
    )
    whole = llm.generate(PROMPTS[0], greedy(12, stop=[stop]), use_tqdm=False)[0].outputs[0]
    reasons = [
        d.finish_reason for d in llm.generate(PROMPTS[0], greedy(12, stop=[stop]), stream=True) if d.finish_reason
    ]
    assert (whole.finish_reason, whole.stop_reason, reasons) == ("stop", stop, ["stop"])
    assert whole.text == full.text[: -len(stop)] and whole.token_ids == full.token_ids


def test_a_stop_token_outside_the_vocabulary_is_a_sampling_error_naming_its_field(llm):
    """It was `TypeError: SamplingError.__init__() missing 1 required positional argument`."""
    for prompts, where in ((PROMPTS[0], ""), (PROMPTS[:2], "prompt 0: ")):
        with pytest.raises(SamplingError, match=f"^{where}stop token id 99999 is outside the model's vocabulary") as e:
            llm.generate(prompts, SamplingParams(stop_token_ids=[99999]), use_tqdm=False)
        assert e.value.field == "stop_token_ids"
    assert not llm.engine.has_work()


def test_two_streams_read_in_turn_each_get_exactly_their_own_text(llm):
    """Each stream stepped the engine and dropped the other's tokens ('The I a, the\\n')."""
    tok = llm.get_tokenizer()
    want = [tok.decode(generate(llm.model, tok.encode(p), 24, eos_id=0), skip_special_tokens=True) for p in PROMPTS[:2]]
    a = llm.generate(PROMPTS[0], greedy(24), stream=True)
    b = llm.generate(PROMPTS[1], greedy(24), stream=True)
    got = {0: "", 1: ""}
    live = {0: a, 1: b}
    while live:
        for k, s in list(live.items()):
            d = next(s, None)
            if d is None:
                del live[k]
            else:
                got[k] += d.text
    assert [got[0], got[1]] == want


def test_two_threads_on_one_llm_each_get_their_own_outputs():
    """One thread crashed in engine/commit.py and the other got another prompt's tokens."""
    llm = LLM(max_num_seqs=8)
    sp = greedy(8)
    tok = llm.get_tokenizer()
    want = [generate(llm.model, tok.encode(p), 8, eos_id=0) for p in PROMPTS]  # each alone
    wrong, errors = [], []

    def work(order: list[int]) -> None:
        try:
            for _ in range(50):
                outs = llm.generate([PROMPTS[i] for i in order], sp, use_tqdm=False)
                wrong.extend(i for i, o in zip(order, outs) if o.outputs[0].token_ids != want[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(order,)) for order in ([0, 1, 2, 3], [3, 2, 1, 0])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not wrong and not any(t.is_alive() for t in threads)
    assert not llm.engine.has_work() and not llm.engine.results


def test_numpy_integers_are_token_ids(llm):
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    as_np = llm.generate([np.int64(t) for t in ids], greedy(6), use_tqdm=False)[0]
    assert as_np.prompt is None and as_np.token_ids == llm.generate(ids, greedy(6), use_tqdm=False)[0].token_ids


def test_a_dropped_or_closed_stream_ends_its_requests_at_once(llm):
    """A stream left unread kept its requests in the engine; dropping it, closing it or leaving
    its with-block now aborts them before the call returns."""
    s = llm.generate(PROMPTS, greedy(60), stream=True)
    next(s)
    del s
    assert not llm.engine.has_work()
    with llm.generate(PROMPTS, greedy(60), stream=True) as s:
        next(s)
    assert not llm.engine.has_work() and not llm.engine.results


# -- vLLM's options: what they do here, and what is refused ---------------------------------------
def test_stop_tokens_and_strings_in_the_text_as_vllm(llm):
    full = llm.generate(PROMPTS[0], greedy(20), use_tqdm=False)[0].outputs[0]
    t = full.token_ids[5]
    first = full.token_ids.index(t)
    by_id = llm.generate(PROMPTS[0], greedy(20, stop_token_ids=[t]), use_tqdm=False)[0].outputs[0]
    kept = llm.generate(PROMPTS[0], greedy(20, stop_token_ids=[t], include_stop_str_in_output=True), use_tqdm=False)
    tok = llm.get_tokenizer()
    assert by_id.token_ids == full.token_ids[: first + 1] and (by_id.finish_reason, by_id.stop_reason) == ("stop", t)
    assert by_id.text == tok.decode(full.token_ids[:first])  # the stop token's text left out
    assert kept[0].outputs[0].text == tok.decode(full.token_ids[: first + 1])
    stop = full.text[4:7]
    with_str = llm.generate(PROMPTS[0], greedy(20, stop=stop, include_stop_str_in_output=True), use_tqdm=False)
    assert with_str[0].outputs[0].text == full.text[: full.text.index(stop) + len(stop)]
    silent = llm.generate(PROMPTS[0], greedy(20, detokenize=False, logprobs=1), use_tqdm=False)[0].outputs[0]
    assert silent.text == "" and silent.token_ids == full.token_ids
    assert all(p[tid].decoded_token is None for tid, p in zip(silent.token_ids, silent.logprobs))


def test_max_tokens_none_runs_to_the_end_of_the_context():
    small = LLM(max_model_len=40, max_num_seqs=2)
    out = small.generate(PROMPTS[0], SamplingParams(max_tokens=None, temperature=0, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 40 and out.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(tensor_parallel_size=2), ValueError, "tensor_parallel_size=2: tensor parallelism is not supported"),
        (dict(enable_lora=True), ValueError, "enable_lora=True: LoRA adapters are not supported"),
        (dict(quantization="awq"), ValueError, "quantization='awq': quantized checkpoints are not supported"),
        (dict(gpu_memory_utilization=0.5, device="cpu"), ValueError, "gpu_memory_utilization sizes the KV cache"),
        (dict(swap_sapce=4), TypeError, "unexpected keyword argument 'swap_sapce'"),
        (dict(dtype="float16"), ValueError, "dtype must be one of 'auto'"),
        (dict(tokenizer="/nonexistent"), FileNotFoundError, "/nonexistent: no tokenizer.json"),
    ],
)
def test_what_vllm_has_and_tinyllm_cannot_do_is_refused_by_name(kwargs, error, message):
    with pytest.raises(error, match=message):
        LLM(**kwargs)


def test_vllms_engine_arguments_reach_the_engine():
    llm = LLM(
        str(BUNDLED_MODEL),
        tokenizer=str(BUNDLED_MODEL),
        max_model_len=128,
        max_num_seqs=3,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        block_size=8,
        kv_cache_memory_bytes=2**20,
        seed=7,
        trust_remote_code=True,
        enforce_eager=True,
    )
    c = llm.engine.config
    assert (c.max_len, c.max_num_seqs, c.max_batched_tokens, c.prefix_cache, c.block_size) == (128, 3, 64, False, 8)
    assert (c.kv_memory_mib, c.seed) == (1.0, 7)
    assert llm.generate("ROMEO:\n", greedy(4), use_tqdm=False)[0].text  # its tokenizer: a directory


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(logit_bias={5: 1.0}), "logit_bias"),
        (dict(prompt_logprobs=-1), "prompt_logprobs"),
        (dict(stop="x", detokenize=False), "stop"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output"),
    ],
)
def test_sampling_params_refuse_what_this_engine_cannot_do(kwargs, field):
    with pytest.raises(SamplingError, match=field) as e:
        SamplingParams(**kwargs)
    assert e.value.field == field


def test_get_tokenizer_has_transformers_everyday_surface(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("ROMEO:\n")
    assert tok.decode(ids) == "ROMEO:\n" and tok(["a", "ROMEO:\n"])["input_ids"][1] == ids
    assert tok.eos_token_id == 0 and tok.convert_ids_to_tokens(0) == tok.eos_token and len(tok) == tok.vocab_size
    msgs = [{"role": "user", "content": "Hello"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(msgs, add_generation_prompt=True) == tok.encode(text, add_special_tokens=False)


def test_the_progress_bar_shows_on_a_terminal_only(llm, capsys, monkeypatch):
    llm.generate(PROMPTS[:2], greedy(2))
    assert capsys.readouterr().err == ""  # not a terminal: nothing
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    llm.generate(PROMPTS[:2], greedy(2))
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "2/2" in err and "output:" in err
