"""A thin wrapper over Hugging Face ``tokenizers``: encode, decode, and streaming decode.

Streaming matters because a byte-level BPE token can end in the middle of a UTF-8 character;
``DecodeStream`` holds such bytes back until the character is complete, so text appended token
by token equals decoding all tokens at once.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")  # what HF hands a chat template
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>")


class TokenStream:
    """Incremental decoder for one request's generated tokens."""

    def __init__(self, tok: HFTokenizer, skip_special_tokens: bool = False):
        self._tok = tok
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """Text this token completes ('' while a multi-byte character is still partial)."""
        return self._stream.step(self._tok, token_id) or ""


class Tokenizer:
    def __init__(
        self,
        hf: HFTokenizer,
        eos_id: int | None = None,
        bos_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: dict[str, str | None] | None = None,
    ):
        self.hf = hf
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.chat_template = chat_template  # Jinja source, from tokenizer_config.json
        self.special_tokens = special_tokens or {}  # bos_token, eos_token, ...: a template's variables

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json``; EOS/BOS from ``tokenizer_config.json`` when present."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json (a Hugging Face tokenizers file is required)")
        try:
            hf = HFTokenizer.from_file(str(tj))
        except Exception as e:  # the library raises a bare Exception on bad JSON
            raise ValueError(f"{tj}: not a valid tokenizers file ({e})") from None
        eos = bos = template = None
        special: dict[str, str | None] = {}
        cfg = path / "tokenizer_config.json"
        if cfg.is_file():
            meta = json.loads(cfg.read_text())
            eos = _token_id(hf, meta.get("eos_token"))
            bos = _token_id(hf, meta.get("bos_token"))
            template = _chat_template(meta.get("chat_template"))
            special = {k: _token_text(meta.get(k)) for k in SPECIAL_TOKEN_KEYS}
        jinja = path / "chat_template.jinja"  # newer transformers save it on its own
        if template is None and jinja.is_file():
            template = jinja.read_text()
        if eos is None:
            eos = next((hf.token_to_id(t) for t in EOS_CANDIDATES if hf.token_to_id(t) is not None), None)
        return cls(hf, eos, bos, template, special)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the tokenizer's post-processor
        (e.g. a Llama BOS), as vLLM's /tokenize does by default. Through ``encode_batch``, the same
        ids: it lets go of Python's lock while it works (``encode`` holds it: a server tokenizing a
        long text in a worker thread stopped answering anyone else for seconds)."""
        return self.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def stream(self, skip_special_tokens: bool = False) -> TokenStream:
        return TokenStream(self.hf, skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The token's own text (for display), decoded alone."""
        return self.hf.decode([token_id], skip_special_tokens=False)


def _token_text(tok) -> str | None:
    if isinstance(tok, dict):  # {"content": "</s>", ...} in older configs
        tok = tok.get("content")
    return tok if isinstance(tok, str) else None


def _chat_template(t) -> str | None:
    """A config's ``chat_template``: a string, or a list of named ones (the "default" is used)."""
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) and t else None


def _token_id(hf: HFTokenizer, tok) -> int | None:
    if isinstance(tok, dict):  # {"content": "</s>", ...} in older configs
        tok = tok.get("content")
    return hf.token_to_id(tok) if isinstance(tok, str) else None
