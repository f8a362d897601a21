"""Load and save Hugging Face Llama-family checkpoints (config.json + safetensors + tokenizer.json).

safetensors only: a pickle can run code, so ``.bin``/``.pt`` files are refused, never opened.
Nothing is downloaded: a path that is not a local directory is an error. Every problem is a
``CheckpointError`` that names the file and what was wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tinyllm.model import ModelConfig, Transformer
from tinyllm.tokenizer import Tokenizer

BUNDLED_MODEL = Path(__file__).parent / "data" / "shakespeare"
SUPPORTED_ARCHS = ("LlamaForCausalLM",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded, with the reason."""


def default_model_dir() -> Path:
    return BUNDLED_MODEL


def config_from_hf(hf: dict, where: str = "config.json") -> ModelConfig:
    """Map a HF LlamaConfig dict to ModelConfig, refusing options this model does not implement."""
    archs = hf.get("architectures") or []
    if hf.get("model_type") not in (None, "llama") or (archs and archs[0] not in SUPPORTED_ARCHS):
        raise CheckpointError(f"{where}: unsupported architecture {archs or hf.get('model_type')!r}; "
                              f"supported: {', '.join(SUPPORTED_ARCHS)}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: unsupported hidden_act {hf['hidden_act']!r} (only 'silu')")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise CheckpointError(f"{where}: unsupported option {flag}=true (biases are not implemented)")
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{where}: unsupported rope scaling {rope_type!r} (only default RoPE)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size") if k not in hf]
    if missing:
        raise CheckpointError(f"{where}: missing required field(s) {', '.join(missing)}")
    n_heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // n_heads
    if head_dim * n_heads != hf["hidden_size"]:
        raise CheckpointError(f"{where}: unsupported head_dim {head_dim} != hidden_size / num_attention_heads")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            d_ff=hf["intermediate_size"], max_seq_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta), norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None


def config_to_hf(cfg: ModelConfig, eos_id: int | None = None, bos_id: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
        "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "head_dim": cfg.head_dim,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32",
    }


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    files: list[Path]
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        files = [path / f for f in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index}: names shard {f.name}, which is missing")
    else:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {', '.join(pickles)}: pickle files are never loaded; convert to safetensors)" if pickles else ""
        raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f}: cannot read safetensors ({e})") from None
    return state


def load_config_and_tokenizer(path: str | Path | None = None) -> tuple[ModelConfig, Tokenizer]:
    """The checkpoint's shape and tokenizer, without its weights: cheap, for callers that only
    need to validate input (the app, whose engine loads the weights in another process)."""
    path = Path(path) if path is not None else BUNDLED_MODEL
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (expected a local checkpoint with config.json, "
                              "model.safetensors and tokenizer.json; nothing is downloaded)")
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
        raise CheckpointError(f"{path}: tokenizer has {tok.vocab_size} tokens but the model's vocab_size "
                              f"is {cfg.vocab_size}")
    return cfg, tok


def load_checkpoint(path: str | Path | None = None, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None) -> tuple[Transformer, Tokenizer]:
    """Load a local HF Llama-family checkpoint directory (default: the bundled model)."""
    path = Path(path) if path is not None else BUNDLED_MODEL
    cfg, tok = load_config_and_tokenizer(path)
    state = _read_weights(path)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    # Big models are built on the meta device (no memory, no init); small ones on the CPU, where
    # module init is cheaper than the one-time import torch makes for meta-device init (~1 s).
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    approx = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * (2 * d * d + 2 * d * kv + 3 * d * cfg.d_ff)
    with torch.device("meta" if approx > 50_000_000 else "cpu"):
        model = Transformer(cfg, init_weights=False)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match config.json: "
                              f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                              f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
    for k, shape in expected.items():
        if state[k].shape != shape:
            raise CheckpointError(f"{path}: weight {k} has shape {tuple(state[k].shape)}, "
                                  f"config.json implies {tuple(shape)}")
    dtype = dtype or torch.float32
    state = {k: v.to(dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=not cfg.tie_embeddings, assign=True)   # no random init, no copy
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.reset_rope()
    model.to(device=device or "cpu")
    model.eval()
    return model, tok


def save_checkpoint(model: Transformer, out: str | Path, tokenizer_dir: str | Path | None = None,
                    eos_id: int | None = None, bos_id: int | None = None,
                    dtype: torch.dtype = torch.float32) -> None:
    """Write config.json (LlamaForCausalLM), model.safetensors and generation_config.json;
    copy tokenizer files from ``tokenizer_dir`` when given. ``dtype=torch.float16`` halves the
    file (the bundled model ships that way); loading upcasts to the requested dtype."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    state = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            if cfg.tie_embeddings:
                continue
            state[k] = v.detach().to(dtype).contiguous().cpu()
        else:
            state["model." + k] = v.detach().to(dtype).contiguous().cpu()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_cfg = config_to_hf(cfg, eos_id, bos_id)
    hf_cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    gen = {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": True, "temperature": 0.8}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer_dir is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            src = Path(tokenizer_dir) / name
            if src.is_file() and src.resolve() != (out / name).resolve():
                (out / name).write_bytes(src.read_bytes())
