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

from tinyllm.model.config import (  # noqa: F401 (re-exported)
    BUNDLED_MODEL,
    CheckpointError,
    config_from_hf,
    config_to_hf,
    default_model_dir,
    load_config_and_tokenizer,
)
from tinyllm.model.tokenizer import Tokenizer
from tinyllm.model.transformer import Transformer


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
        names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
        bad = next(
            (n for n in names or [] if not isinstance(n, str) or n in ("", ".", "..") or "/" in n or "\\" in n), None
        )
        if names is None or bad is not None:  # a shard is a file beside the index, never a path
            raise CheckpointError(
                f"{index}: weight_map must name shard files in {path}, got {bad if names is not None else weight_map}"[
                    :300
                ]
            )
        files = [path / f for f in names]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index}: names shard {f.name}, which is missing")
    else:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = (
            f" (found {', '.join(pickles)}: pickle files are never loaded; convert to safetensors)" if pickles else ""
        )
        raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f}: cannot read safetensors ({e})") from None
    return state


def load_checkpoint(
    path: str | Path | None = None, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> tuple[Transformer, Tokenizer]:
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
    approx = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * (
        2 * d * d + 2 * d * kv + 3 * d * cfg.d_ff
    )
    with torch.device("meta" if approx > 50_000_000 else "cpu"):
        model = Transformer(cfg, init_weights=False)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(k for k in set(state) - set(expected) if "rotary_emb" not in k)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match config.json: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for k, shape in expected.items():
        if state[k].shape != shape:
            raise CheckpointError(
                f"{path}: weight {k} has shape {tuple(state[k].shape)}, config.json implies {tuple(shape)}"
            )
    dtype = dtype or torch.float32
    state = {k: v.to(dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=not cfg.tie_embeddings, assign=True)  # no random init, no copy
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.reset_rope()
    model.to(device=device or "cpu")
    model.eval()
    return model, tok


def save_checkpoint(
    model: Transformer,
    out: str | Path,
    tokenizer_dir: str | Path | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> None:
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
