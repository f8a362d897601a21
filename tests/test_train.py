"""The training pipeline end to end on a toy corpus: tokenizer, held-out split, checkpoint, resume."""

from __future__ import annotations

import json

from tinyllm.checkpoint import load_checkpoint
from tinyllm.config import ModelConfig
from tinyllm.train import HELD_OUT, TrainConfig, clean, train

TEXT = ("ROMEO.\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
        "JULIET.\nO Romeo, Romeo, wherefore art thou Romeo?\n\n\n\n\n") * 30


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
    assert any("2 train works" in line and "3 held out" in line for line in logs)   # *_gut_f.txt ignored
    model, tok = load_checkpoint(out)
    assert model.cfg.n_layers == 1 and tok.eos_id is not None
    assert json.loads((out / "training_metrics.json").read_text())["steps"] == 3
    assert m1["val_nats_per_char"] > 0
    tc.steps = 5
    logs.clear()
    train(corpus, out, tc, tmp_path / "work", log=logs.append)
    assert any(line == "resumed at step 3" for line in logs)
    assert json.loads((out / "training_metrics.json").read_text())["steps"] == 5
