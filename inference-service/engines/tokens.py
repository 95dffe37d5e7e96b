"""A token's own bytes and the text the API shows for it, the same in every engine.

A byte-level BPE token (GPT-2's scheme: SmolLM2, Llama 3, Qwen) may hold part of a UTF-8 character: ``日`` is three
bytes that two tokens can share. Decoding such a token alone gives U+FFFD, whose bytes are not the token's, and whose
length makes character offsets drift. :class:`TokenTexts` reads each token's real bytes from the tokenizer's
vocabulary instead (the byte-level alphabet mapped back to bytes; SentencePiece's ``▁`` as a space and its byte
tokens ``<0xE6>`` as the byte), and shows the token as its text where the bytes are whole UTF-8, else as OpenAI does,
``bytes:\\xe6\\x97`` (with the real bytes in ``bytes``). :class:`CharOffsets` turns tokens' bytes into character
offsets that index the text they make up.
"""

from __future__ import annotations

import codecs
import re
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (``bytes_to_unicode``) read backwards: each of its 256 characters to its byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def _scheme(tokenizer: Any) -> str:
    """``byte_level`` (a ByteLevel decoder), ``sentencepiece`` (Metaspace or byte fallback), else ``text``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = backend.to_str() if backend is not None else ""
    if '"ByteLevel"' in decoder.split('"decoder"', 1)[-1][:2000]:
        return "byte_level"
    if "ByteFallback" in decoder or "Metaspace" in decoder or "sentencepiece" in type(tokenizer).__name__.lower():
        return "sentencepiece"
    return "text"


def shown(raw: bytes) -> str:
    """How the API shows a token of bytes ``raw``: its text where they are whole UTF-8, else ``bytes:\\xNN…``."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class TokenTexts:
    """Per token id of one tokenizer, ``(shown text, real bytes)``, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._scheme = _scheme(tokenizer)
        self._decoder = _byte_decoder() if self._scheme == "byte_level" else {}
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def of(self, token: int) -> tuple[str, list[int]]:
        """``(text, bytes)`` of ``token``."""
        if token not in self._cache:
            raw = self.raw(token)
            self._cache[token] = (shown(raw), list(raw))
        return self._cache[token]

    def raw(self, token: int) -> bytes:
        """The token's own bytes. A special token (``<|im_end|>``) is its text's bytes."""
        if token in self._special:
            return self._tokenizer.decode([token]).encode("utf-8")
        piece = self._tokenizer.convert_ids_to_tokens(token)
        if self._scheme == "byte_level" and piece is not None and all(c in self._decoder for c in piece):
            return bytes(self._decoder[c] for c in piece)
        if self._scheme == "sentencepiece" and piece is not None:
            if match := _BYTE_TOKEN.fullmatch(piece):
                return bytes([int(match.group(1), 16)])
            return piece.replace("\u2581", " ").encode("utf-8")
        return self._tokenizer.decode([token]).encode("utf-8", "surrogatepass")


class CharOffsets:
    """Character offsets of tokens in the text their bytes make up, token by token (a stream's deltas keep one per
    choice): :meth:`add` gives a token's offset, then counts its bytes. A token that starts inside a character (a
    continuation byte first) has the offset of that character, so every offset indexes the text."""

    def __init__(self, start: int = 0) -> None:
        self.chars = start
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, raw: list[int] | bytes) -> int:
        """The offset of a token of bytes ``raw``, which then counts in the text before the next."""
        offset = self.chars
        self.chars += len(self._decoder.decode(bytes(raw)))
        return offset
