"""Prefixed, time-sortable identifiers (``run_…``, ``ds_…``, ``har_…``, ``job_…``, ``ckpt_…``, ``eval_…``, ``sub_…``, ``bm_…``, ``tks_…``, ``req_…``).

An ID is ``<prefix>_<26 Crockford base32 chars>``: 48 bits of milliseconds since the epoch followed by
80 random bits (the ULID layout), so IDs sort by creation time as strings.
"""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PREFIXES = frozenset({"run", "ds", "job", "ckpt", "eval", "sub", "bm", "hold", "ent", "acct", "evt", "key", "item", "har",
                      "tks", "req", "st"})  # tks, req, st: a session of Tinker's primitives, its requests, a live model's saved state


def new_id(prefix: str) -> str:
    """Return a new ID such as ``job_01jd3k…``; raises ``ValueError`` for an unknown prefix."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def has_prefix(value: str, prefix: str) -> bool:
    """True when ``value`` looks like an ID of kind ``prefix`` (``ckpt_…`` for ``"ckpt"``)."""
    return value.startswith(prefix + "_") and len(value) == len(prefix) + 27
