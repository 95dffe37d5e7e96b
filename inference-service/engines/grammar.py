"""JSON-schema decoding for the transformers engine, by xgrammar (the grammar engine vLLM uses): a schema is compiled
into a grammar once (the compiler caches it), and each row decoded under it gets a matcher of its own that masks the
tokens the schema does not allow at each step.

Invariants: no free whitespace (``any_whitespace=False``, as the vLLM engine); the end-of-turn tokens end a grammar; a
schema xgrammar cannot compile is :class:`~inference_service.engines.base.SchemaNotServed` (checked when a request is
admitted, so a stream never begins for it). The compiler is built on first use, under a lock.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from inference_service.engines.base import SchemaNotServed


class JsonSchemas:
    """The grammars of one tokenizer's vocabulary (``vocab`` ids, ending at ``eos``)."""

    def __init__(self, tokenizer: Any, vocab: int, eos: set[int]) -> None:
        self._tokenizer, self._vocab, self._eos = tokenizer, vocab, eos
        self._compiler: Any = None
        self._lock = threading.Lock()

    def _grammar(self, schema: dict[str, Any]) -> Any:
        """The compiled grammar of a JSON schema (``{}``: any JSON value), cached by the compiler;
        :class:`SchemaNotServed` if xgrammar cannot compile it."""
        import xgrammar

        with self._lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(self._tokenizer, vocab_size=self._vocab, stop_token_ids=sorted(self._eos))
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        try:
            return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError (and others) for schemas it cannot decode under
            raise SchemaNotServed(f"the JSON schema cannot be decoded under: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc

    def check(self, schema: dict[str, Any]) -> None:
        """:class:`SchemaNotServed` unless xgrammar compiles ``schema`` (the grammar is cached for the request's rows)."""
        self._grammar(schema)

    def matcher(self, schema: dict[str, Any]) -> Any:
        """A fresh xgrammar matcher for a JSON schema (one per row)."""
        import xgrammar

        return xgrammar.GrammarMatcher(self._grammar(schema))
