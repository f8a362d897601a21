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


class PreTrainedTokenizerView:
    """A Tokenizer with transformers' everyday surface, what ``LLM.get_tokenizer()`` returns
    (vLLM returns a transformers tokenizer, and scripts call these): ``encode`` (special tokens
    added by default, as transformers), ``decode``, ``batch_decode``, ``__call__``,
    ``apply_chat_template``, ``eos_token_id`` and friends. ``base`` is the engine's Tokenizer."""

    def __init__(self, base: Tokenizer):
        self.base = base

    @property
    def eos_token_id(self) -> int | None:
        return self.base.eos_id

    @property
    def bos_token_id(self) -> int | None:
        return self.base.bos_id

    @property
    def eos_token(self) -> str | None:
        return self.base.special_tokens.get("eos_token") or (
            None if self.base.eos_id is None else self.base.hf.id_to_token(self.base.eos_id)
        )

    @property
    def bos_token(self) -> str | None:
        return self.base.special_tokens.get("bos_token") or (
            None if self.base.bos_id is None else self.base.hf.id_to_token(self.base.bos_id)
        )

    @property
    def pad_token_id(self) -> int | None:
        pad = self.base.special_tokens.get("pad_token")
        return None if pad is None else self.base.hf.token_to_id(pad)

    @property
    def chat_template(self) -> str | None:
        return self.base.chat_template

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    def __len__(self) -> int:
        return self.base.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return self.base.hf.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.base.encode(text, add_special_tokens)

    def decode(self, ids: int | list[int], skip_special_tokens: bool = False) -> str:
        return self.base.decode([ids] if isinstance(ids, int) else list(ids), skip_special_tokens)

    def batch_decode(self, batch: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self.base.hf.id_to_token(ids)
        return [self.base.hf.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.base.hf.token_to_id(tokens)
        return [self.base.hf.token_to_id(t) for t in tokens]

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, list]:
        """``{"input_ids": ..., "attention_mask": ...}`` for one text or a list, as transformers."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        batch = [self.encode(t, add_special_tokens) for t in text]
        return {"input_ids": batch, "attention_mask": [[1] * len(ids) for ids in batch]}

    def apply_chat_template(
        self,
        conversation: list[dict],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        chat_template: str | None = None,
        **kwargs: object,
    ) -> str | list[int]:
        """The conversation rendered by the checkpoint's template (or ``chat_template``: Jinja
        source or a file), as transformers (``tokenize=True``: its ids, no special tokens added:
        the template writes them). Extra keywords are the template's variables."""
        from tinyllm.serve.chat_template import render

        text = render(
            template_source(chat_template) if chat_template is not None else self.base.chat_template,
            conversation,
            add_generation_prompt,
            {**self.base.special_tokens, **kwargs},
        )
        return self.base.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return f"PreTrainedTokenizerView(vocab_size={self.vocab_size}, eos_token_id={self.eos_token_id})"


def template_source(template: str) -> str:
    """A chat template given as Jinja source or as the path of a file holding it (vLLM takes both)."""
    if "{" not in template and Path(template).is_file():
        return Path(template).read_text()
    return template
