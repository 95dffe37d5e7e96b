"""The inference service's queries: its one table, the log of served completions (:class:`CompletionLog`), written
once per call when its tokens are settled (for usage audits; never read by the service)."""

from __future__ import annotations

from inference_service.models import CompletionLog

from services.common.db import Database, utcnow


def log_completion(db: Database, *, call_id: str, run_id: str | None, model: str, prompt_tokens: int, completion_tokens: int,
                   metered: bool, hold_id: str | None, latency_ms: int) -> None:
    """Record one served call: who (``run_id``), which ``model`` as asked for, its tokens, whether it was metered
    and against which hold, how long it took."""
    with db.session() as s:
        s.add(CompletionLog(id=call_id, run_id=run_id, model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            metered=metered, hold_id=hold_id, latency_ms=latency_ms, created_at=utcnow()))
