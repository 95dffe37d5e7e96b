"""The hidden test-set store: test items and per-item test outcomes, in their own database.

Only the grader imports this module, and only the grader's configuration holds its URL. Nothing read
from here leaves the grader except aggregate scores.

This module is storage only, that database's tables and its repository (every query of it is a method of
:class:`TestStore`); the rules that use it (drawing the split, scoring, what leaves the grader) are in the grader's
logic modules, and the queries of the grader's main database in :mod:`grader.repository`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Float, Integer, String, Text, UniqueConstraint, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from grader.suites import Item
from services.common.db import Database, migrate


class TestBase(DeclarativeBase):
    pass


class TestItem(TestBase):
    __tablename__ = "test_items"
    __table_args__ = (UniqueConstraint("task_id", "item_id"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(40), index=True)
    item_id: Mapped[str] = mapped_column(String(40))
    position: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    entry: Mapped[dict[str, Any]] = mapped_column(JSON)


class TestOutcome(TestBase):
    """One sample of one test item in one evaluation: kept for audits, never returned."""

    __tablename__ = "test_outcomes"
    __table_args__ = (UniqueConstraint("evaluation_id", "item_id", "sample"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[str] = mapped_column(String(40), index=True)
    item_id: Mapped[str] = mapped_column(String(40))
    sample: Mapped[int] = mapped_column(Integer)
    completion: Mapped[str] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    score: Mapped[float] = mapped_column(Float)
    score_error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why the scorer could not score the answer (score 0)


class TestStore:
    """Read and write the hidden split of each grading task."""

    def __init__(self, url: str) -> None:
        self.db = Database(url)
        migrate(url, Path(__file__).parent / "teststore_migrations")
        if url.startswith("sqlite:///"):
            for suffix in ("", "-wal", "-shm"):
                path = Path(url.removeprefix("sqlite:///") + suffix)
                if path.exists():
                    path.chmod(0o600)

    def put_items(self, task_id: str, items: list[Item]) -> None:
        """Store the task's test items (once; a second call is a no-op)."""
        with self.db.session() as s:
            if s.scalar(select(TestItem.pk).where(TestItem.task_id == task_id).limit(1)) is not None:
                return
            s.add_all(TestItem(task_id=task_id, item_id=it.id, position=i, question=it.question, answer=it.answer, entry=it.entry) for i, it in enumerate(items))

    def items(self, task_id: str) -> list[Item]:
        """The task's test items, in split order."""
        with self.db.session() as s:
            rows = s.scalars(select(TestItem).where(TestItem.task_id == task_id).order_by(TestItem.position))
            return [Item(id=r.item_id, question=r.question, answer=r.answer, entry=r.entry) for r in rows]

    def done(self, evaluation_id: str) -> dict[tuple[str, int], float]:
        """Scores already recorded for the evaluation, by (item id, sample)."""
        with self.db.session() as s:
            rows = s.execute(select(TestOutcome.item_id, TestOutcome.sample, TestOutcome.score).where(TestOutcome.evaluation_id == evaluation_id))
            return {(i, k): sc for i, k, sc in rows}

    def record(self, evaluation_id: str, item_id: str, sample: int, completion: str, answer: str | None, score: float,
               score_error: str | None = None) -> None:
        """Store one sample's outcome; ``score_error``: why the scorer could not score ``answer`` (then ``score`` is 0)."""
        with self.db.session() as s:
            s.add(TestOutcome(evaluation_id=evaluation_id, item_id=item_id, sample=sample, completion=completion, answer=answer, score=score,
                              score_error=score_error))
