"""A checkpoint's shape and tokenizer, read without torch.

Split from ``checkpoint`` (which loads the weights) so the app can check ``--model``, size its
screen and validate prompts in milliseconds, while its engine process imports torch and loads
the weights. Every problem is a ``CheckpointError`` naming the file and what was wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tinyllm.model.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family model's shape (config.json's fields, by their names here); the defaults are
    a small one's (4 layers of 256: tests, and ``tinyllm bench --random-model``'s starting point).
    The KV cache's size per token follows from it: 2 x n_layers x n_kv_heads x head_dim elements."""

    vocab_size: int = 4096  # tokens the embedding and the output head know
    d_model: int = 256  # hidden_size: the residual stream's width
    n_layers: int = 4  # num_hidden_layers
    n_heads: int = 4  # num_attention_heads: query heads, of head_dim = d_model / n_heads each
    n_kv_heads: int = 2  # num_key_value_heads: each K/V head serves n_heads / n_kv_heads query heads
    d_ff: int = 704  # intermediate_size: the SwiGLU MLP's width
    max_seq_len: int = 512  # max_position_embeddings: the longest context (prompt + output)
    rope_theta: float = 10000.0  # the rotary embeddings' base
    norm_eps: float = 1e-5  # rms_norm_eps
    tie_embeddings: bool = True  # tie_word_embeddings: the output head reuses the embedding

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"ModelConfig: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


BUNDLED_MODEL = Path(__file__).parent.parent / "data" / "shakespeare"
BUNDLED_DRAFT = Path(__file__).parent.parent / "data" / "shakespeare-draft"
BUNDLED_DRAFT_NAME = "tinyllm-shakespeare-draft"  # what a speculative_config's "model" calls it


def resolve_draft_model(name: str) -> Path:
    """A speculative_config's ``model``: the bundled draft by its name, else a checkpoint directory."""
    return BUNDLED_DRAFT if name == BUNDLED_DRAFT_NAME else Path(name)


SUPPORTED_ARCHS = ("LlamaForCausalLM",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded, with the reason."""


def default_kv_blocks(n_slots: int, max_len: int, block_size: int) -> int:
    """The paged pool's default size: the same memory as a slot cache of n_slots x max_len."""
    return n_slots * -(-max_len // block_size)


def default_model_dir() -> Path:
    return BUNDLED_MODEL


BUNDLED_LABEL = "bundled Shakespeare"


def model_label(model_dir: str | Path | None) -> str:
    """The model's name on screen: "bundled Shakespeare" for the shipped checkpoint (the default,
    or its directory given by path), else its directory's name."""
    if model_dir is None:
        return BUNDLED_LABEL
    try:
        bundled = Path(model_dir).resolve() == BUNDLED_MODEL.resolve()
    except OSError:
        bundled = False
    return BUNDLED_LABEL if bundled else Path(model_dir).name


CONFIG_BOUNDS = {  # config.json's integer fields and the most each may be (real checkpoints are far below)
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "intermediate_size": 1 << 18,
    "max_position_embeddings": 1 << 20,  # the rotary tables are built for this many positions
    "head_dim": 1 << 10,
}
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def _check_int(hf: dict, key: str, most: int, where: str) -> None:
    v = hf[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
        raise CheckpointError(f"{where}: {key} must be an integer from 1 to {most}, got {v!r}")


def config_from_hf(hf: dict, where: str = "config.json") -> ModelConfig:
    """Map a HF LlamaConfig dict to ModelConfig, refusing options this model does not implement
    and values no checkpoint has (a crafted file's 1e7 layers or 1e8 positions: a one-line refusal,
    not a hang or 12 GB of rotary tables)."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{where}: must hold a JSON object, got {type(hf).__name__}")
    archs = hf.get("architectures") or []
    if hf.get("model_type") not in (None, "llama") or (archs and archs[0] not in SUPPORTED_ARCHS):
        raise CheckpointError(
            f"{where}: unsupported architecture {archs or hf.get('model_type')!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: unsupported hidden_act {hf['hidden_act']!r} (only 'silu')")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise CheckpointError(f"{where}: unsupported option {flag}=true (biases are not implemented)")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise CheckpointError(f"{where}: rope_scaling must be an object, got {type(rope).__name__}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{where}: unsupported rope scaling {rope_type!r} (only default RoPE)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    missing = [k for k in REQUIRED if k not in hf]
    if missing:
        raise CheckpointError(f"{where}: missing required field(s) {', '.join(missing)}")
    for key, most in CONFIG_BOUNDS.items():  # a crafted file must not hang or allocate the machine away
        if key in REQUIRED or hf.get(key) is not None:  # (the optional ones may be null: their default)
            _check_int(hf, key, most, where)
    for key in ("rope_theta", "rms_norm_eps"):
        v = theta if key == "rope_theta" else hf.get(key, 1e-6)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise CheckpointError(f"{where}: {key} must be a finite number > 0, got {v!r}")
    n_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // n_heads
    if head_dim * n_heads != hf["hidden_size"]:
        raise CheckpointError(f"{where}: unsupported head_dim {head_dim} != hidden_size / num_attention_heads")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            d_ff=hf["intermediate_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta),
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def config_to_hf(cfg: ModelConfig, eos_id: int | None = None, bos_id: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "head_dim": cfg.head_dim,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def load_config_and_tokenizer(path: str | Path | None = None) -> tuple[ModelConfig, Tokenizer]:
    """The checkpoint's shape and tokenizer, without its weights: cheap, for callers that only
    need to validate input (the app, whose engine loads the weights in another process)."""
    path = Path(path) if path is not None else BUNDLED_MODEL
    if not path.is_dir():
        raise CheckpointError(
            f"{path}: not a directory (expected a local checkpoint with config.json, "
            "model.safetensors and tokenizer.json; nothing is downloaded)"
        )
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        hf_cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from None
    cfg = config_from_hf(hf_cfg, str(cfg_file))
    try:
        tok = Tokenizer.from_dir(path)
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(str(e)) from None
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tok.vocab_size} tokens but the model's vocab_size is {cfg.vocab_size}"
        )
    return cfg, tok
