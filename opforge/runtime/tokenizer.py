"""Text in and out of the generation runner: a ``tokenizer.json`` through the ``tokenizers``
library, an optional dependency (``pip install 'opforge[text]'``).

The end tokens come from the files transformers saves beside ``tokenizer.json``:
``generation_config.json`` and ``config.json`` (``eos_token_id``: an id or a list) and
``tokenizer_config.json`` (``eos_token``: a token, looked up in the vocabulary).

>>> tokenizer = TextTokenizer.from_file("tokenizer.json")   # doctest: +SKIP
>>> tokenizer.decode(tokenizer.encode("hello world"))       # doctest: +SKIP
'hello world'
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from opforge.errors import GenerationError

__all__ = ["TextTokenizer", "tokenizers_available"]

_API = "opforge.runtime.tokenizer.TextTokenizer"
_MAX_CONFIG_BYTES = 16 * 2**20  # the config files are small; a huge one is not one of them


def tokenizers_available() -> bool:
    """Whether the optional ``tokenizers`` library can be imported."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` with the model's end tokens (``eos_ids``)."""

    def __init__(self, tokenizer: object, eos_ids: tuple[int, ...] = (),
                 source: str = "<tokenizer>") -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.source = source

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TextTokenizer":
        """Read ``path`` (a ``tokenizer.json``) and the end tokens from the config files
        beside it. ``GenerationError`` without the ``tokenizers`` library or for a file
        it cannot read."""
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise GenerationError(
                f"`{_API}.from_file({os.fspath(path)!r})`: the optional `tokenizers` library "
                "is not installed — valid: text in and out needs it; token ids do not — fix: "
                "1. pip install 'opforge[text]' (or pip install tokenizers); 2. or pass "
                "--prompt-ids instead of --prompt") from None
        try:
            tokenizer = Tokenizer.from_file(os.fspath(path))
        except Exception as e:  # tokenizers raises its own Exception for a bad file
            raise GenerationError(
                f"`{_API}.from_file({os.fspath(path)!r})`: cannot read it ({e}) — valid: a "
                "tokenizer.json saved by the tokenizers or transformers library — fix: check "
                "the path") from None
        made = cls(tokenizer, source=os.fspath(path))
        made.eos_ids = made._eos_from_configs(Path(path).parent)
        return made

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _eos_from_configs(self, folder: Path) -> tuple[int, ...]:
        ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = _read_json(folder / name).get("eos_token_id")
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, int) and not isinstance(item, bool) and item not in ids:
                    ids.append(item)
        token = _read_json(folder / "tokenizer_config.json").get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str):
            found = self.tokenizer.token_to_id(token)
            if found is not None and found not in ids:
                ids.append(found)
        return tuple(ids)


def _read_json(path: Path) -> dict:
    """The file's JSON object, or ``{}`` when it is absent, too large or not an object."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CONFIG_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
