"""The seed's layout and API keep working: code written against the user's own engine.py (its
import lines, its names, its keyword arguments) runs unchanged, and its docstring contract holds:
each request's tokens equal its solo generate() output. Also the config that replaced the
keywords: one EngineConfig, checked once, equal to the keywords it stands for."""

import subprocess
import sys

import pytest
import torch

from tests.helpers import mixed_workload, random_model, solo_outputs


def fresh_python(code: str, timeout: float = 120) -> str:
    """What ``code`` prints in a new interpreter (nothing imported yet); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_seeds_import_lines_resolve_and_its_contract_holds():
    # Exactly the seed's import lines (shared/seed/engine.py), then its names from tinyllm.engine.
    from tinyllm.engine import (
        ContinuousEngine,
        Event,
        Request,
        Result,
        Sampling,
        Stats,
        prefill_padded,
        run_continuous,
        run_static,
    )
    from tinyllm.generate import sample_next
    from tinyllm.kv_cache import KVCache, SlotKVCache
    from tinyllm.model import Transformer

    model = random_model()
    assert isinstance(model, Transformer)
    assert KVCache.__name__ == "KVCache" and SlotKVCache.__name__ == "SlotKVCache"
    logits = torch.tensor([[0.1, 3.0, -1.0]])
    assert sample_next(logits).tolist() == [[1]]  # greedy: the argmax, (B, 1)
    reqs = mixed_workload(n=10, max_prompt=30, max_new=20)
    solo = solo_outputs(model, reqs)
    static, _ = run_static(model, reqs, 4)
    cont, stats = run_continuous(model, reqs, 3, 128)
    assert [r.tokens for r in static] == solo and [r.tokens for r in cont] == solo
    assert all(isinstance(r, Result) for r in cont) and stats["kv_allocated_at_end"] == 0
    eng = ContinuousEngine(model, 2, 128, 0.0)  # the seed's positional arguments
    rid = eng.add_request(Request(reqs[0].prompt, reqs[0].max_new_tokens, sampling=Sampling()))
    events: list[Event] = []
    while eng.has_work():
        events += eng.step()
    assert [e.token for e in events if e.rid == rid] == solo[0] and eng.results[rid].tokens == solo[0]
    assert isinstance(eng.stats, Stats) and callable(prefill_padded)


def test_generate_is_the_function_wherever_it_is_imported_from():
    """``tinyllm.engine.generate`` was a module (TypeError: 'module' object is not callable);
    ``tinyllm.generate`` is both the seed's module and the function, in either import order."""
    code = (
        "import tinyllm; f = tinyllm.generate; import tinyllm.generate as m; "
        "from tinyllm import generate; from tinyllm.engine import generate as g; "
        "from tinyllm.engine.solo import generate as s; "
        "from tests.helpers import random_model; model = random_model(); "
        "assert g is s and generate(model, [1, 2, 3], 4) == f(model, [1, 2, 3], 4) == m(model, [1, 2, 3], 4) "
        "== s(model, [1, 2, 3], 4); print('ok')"
    )
    assert fresh_python(code) == "ok"


def test_importing_the_package_and_its_config_loads_no_torch():
    """The app imports tinyllm's light modules and must not load torch (nor the package root)."""
    code = (
        "import sys, tinyllm, tinyllm.config, tinyllm.model.config; "
        "from tinyllm.config import EngineConfig; EngineConfig.best(); "
        "print('torch' in sys.modules)"
    )
    assert fresh_python(code, timeout=60) == "False"


def test_a_config_and_the_keywords_it_stands_for_build_the_same_engine():
    from tinyllm.config import EngineConfig
    from tinyllm.engine import ContinuousEngine, run_continuous

    model = random_model()
    reqs = mixed_workload(n=8, max_prompt=30, max_new=20)
    config = EngineConfig.best(max_num_seqs=3, max_len=128, block_size=8, max_batched_tokens=32)
    by_config = ContinuousEngine(model, config=config)
    by_keywords = ContinuousEngine(model, 3, 128, kv="paged", block_size=8, chunked_prefill=True, max_batched_tokens=32)
    assert by_config.config == by_keywords.config == config
    for eng in (by_config, by_keywords):
        assert (eng.n_slots, eng.max_len, eng.kv_kind, eng.max_batched_tokens, eng.prefix_cache) == (
            3,
            128,
            "paged",
            32,
            True,
        )
        assert eng.slots.block_size == 8
    res, _ = run_continuous(model, reqs, config=config)
    assert [r.tokens for r in res] == solo_outputs(model, reqs)
    assert ContinuousEngine(model, config=config, max_len=64).config == config.replace(max_len=64)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(kv="slots", block_size=7), "block_size needs kv='paged'"),
        (dict(kv="slots", kv_blocks=3), "kv_blocks needs kv='paged'"),
        (dict(kv="paged", max_batched_tokens=64), "max_batched_tokens is the token-budget scheduler's"),
        (dict(kv="paged", chunked_prefill=True, scheduling_policy="lifo"), "scheduling policy must be one of fcfs"),
        (dict(kv="pages"), "kv must be 'slots' or 'paged', got 'pages'"),
        (dict(buckets=(16, 32)), "buckets are cuda_graph's"),
        (dict(device="tpu"), "device must be cpu, cuda or cuda:N"),
        (dict(kv="paged", kv_memory_mib=-1.0), "kv_memory_mib must be a number of MiB > 0"),
    ],
)
def test_a_setting_that_does_not_apply_or_is_out_of_range_is_refused_once_by_name(settings, message):
    from tinyllm.config import EngineConfig
    from tinyllm.engine import ContinuousEngine

    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)
    with pytest.raises(ValueError, match=message):  # the seed's keywords: the same check
        ContinuousEngine(random_model(), 2, **settings)


def test_config_is_frozen_keyword_only_and_round_trips_through_json():
    import dataclasses
    import json

    from tinyllm.config import EngineConfig

    config = EngineConfig.best(max_num_seqs=4, kv_cache_dtype="bfloat16", seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kv = "slots"
    with pytest.raises(TypeError):
        EngineConfig("paged")
    assert EngineConfig.from_dict(json.loads(json.dumps(config.as_dict()))) == config
    assert config.changed() == {
        "kv": "paged",
        "max_num_seqs": 4,
        "chunked_prefill": True,
        "kv_cache_dtype": "bfloat16",
        "seed": 3,
    }
    with pytest.raises(ValueError, match="unknown engine setting.*max_num_seq\\b.*the settings are kv, "):
        EngineConfig.from_dict({"max_num_seq": 4})
    with pytest.raises(TypeError, match="unknown setting.*slots_n"):
        from tinyllm.engine import ContinuousEngine

        ContinuousEngine(random_model(), 2, slots_n=3)
