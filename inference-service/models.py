"""ORM tables of the inference service: a log of served completions (for usage audits)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import UTCDateTime, utcnow


class Base(DeclarativeBase):
    pass


class CompletionLog(Base):
    """One served completion: who, which model, how many tokens, whether metered and against which hold."""

    __tablename__ = "completion_log"

    id: Mapped[str] = mapped_column(String(60), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(40), index=True, nullable=True)
    model: Mapped[str] = mapped_column(String(100))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    metered: Mapped[bool] = mapped_column(default=True)
    hold_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    latency_ms: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
