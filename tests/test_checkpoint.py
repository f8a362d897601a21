"""Checkpoint loading: parity with transformers' own Llama, and clear errors for bad directories."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.helpers import random_model
from tinyllm.engine.solo import generate
from tinyllm.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

transformers = pytest.importorskip("transformers")


def write_tokenizer(path, vocab: int) -> None:
    """A word-level tokenizer with ``vocab`` entries (enough for the loader's vocab check)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))


def hf_llama(tmp_path, *, n_heads=4, n_kv_heads=2, tie=False, theta=10000.0, vocab=128, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=96,
        rope_theta=theta,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        initializer_range=0.2,
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    write_tokenizer(tmp_path, vocab)
    return hf


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, tie, theta",
    [
        (4, 2, False, 10000.0),  # GQA, untied
        (4, 4, True, 10000.0),  # MHA, tied
        (4, 1, True, 500000.0),  # MQA, non-default rope theta
    ],
)
def test_logits_and_greedy_match_transformers(tmp_path, n_heads, n_kv_heads, tie, theta):
    hf = hf_llama(tmp_path, n_heads=n_heads, n_kv_heads=n_kv_heads, tie=tie, theta=theta)
    model, tok = load_checkpoint(tmp_path)
    assert model.cfg.n_kv_heads == n_kv_heads and model.cfg.tie_embeddings == tie
    assert model.cfg.rope_theta == theta
    idx = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    prompt = idx[0, :12].tolist()
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=30,
            do_sample=False,
            min_new_tokens=30,
            pad_token_id=0,
            eos_token_id=None,
        )[0, len(prompt) :].tolist()
    assert generate(model, prompt, 30) == ref


def test_save_then_load_roundtrip_and_transformers_reads_ours(tmp_path):
    model = random_model(tie=False)
    write_tokenizer(tmp_path, model.cfg.vocab_size)
    save_checkpoint(model, tmp_path, eos_id=1)
    loaded, _ = load_checkpoint(tmp_path)
    idx = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], loaded(idx)[0])
        hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
        assert (hf(idx).logits - model(idx)[0]).abs().max().item() < 1e-4


def test_sharded_checkpoint_loads(tmp_path):
    hf = hf_llama(tmp_path / "full")
    hf.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="50KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    write_tokenizer(tmp_path / "sharded", 128)
    a, _ = load_checkpoint(tmp_path / "full")
    b, _ = load_checkpoint(tmp_path / "sharded")
    idx = torch.randint(0, 128, (1, 10))
    with torch.no_grad():
        assert torch.equal(a(idx)[0], b(idx)[0])


# -- errors -------------------------------------------------------------------------------


@pytest.fixture
def good_dir(tmp_path):
    hf_llama(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def edit_config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def shard_map(d, name: str) -> None:
    """The weights as a sharded checkpoint whose index names ``name``."""
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": name}}))


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: shutil.rmtree(d), "not a directory"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: (d / "config.json").write_text("{not json"), "invalid JSON"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
        (lambda d: (d / "tokenizer.json").write_text("garbage"), "not a valid tokenizers file"),
        (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "cannot read safetensors"),
        (
            lambda d: edit_config(d, architectures=["MistralForCausalLM"], model_type="mistral"),
            "unsupported architecture",
        ),
        (lambda d: edit_config(d, hidden_act="gelu"), "unsupported hidden_act"),
        (lambda d: edit_config(d, attention_bias=True), "attention_bias"),
        (
            lambda d: edit_config(d, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
            "rope scaling 'yarn'",
        ),
        (lambda d: edit_config(d, intermediate_size=100), "has shape"),
        (lambda d: edit_config(d, num_hidden_layers=3), "missing"),
        (lambda d: edit_config(d, vocab_size=64), "tokenizer has 128 tokens"),
        # crafted files (issue 57): each a one-line refusal, not a hang, 12 GB or a traceback
        (lambda d: edit_config(d, num_hidden_layers=10_000_000), "num_hidden_layers must be an integer from 1 to 1024"),
        (lambda d: edit_config(d, max_position_embeddings=10**8), "max_position_embeddings must be an integer from 1"),
        (
            lambda d: edit_config(d, num_hidden_layers=2.0),
            "num_hidden_layers must be an integer from 1 to 1024, got 2.0",
        ),
        (
            lambda d: edit_config(d, num_hidden_layers=None),
            "num_hidden_layers must be an integer from 1 to 1024, got None",
        ),
        (lambda d: (d / "config.json").write_text("[1, 2]"), "must hold a JSON object, got list"),
        (
            lambda d: edit_config(
                d, rope_theta=float("nan"), rope_parameters={"rope_type": "default", "rope_theta": float("nan")}
            ),
            "rope_theta must be a finite number > 0, got nan",
        ),
        (lambda d: edit_config(d, rope_scaling=[1]), "rope_scaling must be an object"),
        (lambda d: shard_map(d, "../../etc/passwd"), "weight_map must name shard files in"),
    ],
)
def test_broken_checkpoints_give_specific_errors(good_dir, breakage, message):
    breakage(good_dir)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(good_dir)


def test_pickle_weights_are_never_loaded(good_dir):
    (good_dir / "model.safetensors").rename(good_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle files are never loaded"):
        load_checkpoint(good_dir)
