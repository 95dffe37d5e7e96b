"""The hidden test-set store: test items and per-item test outcomes, in their own database.

Only the grader imports this module, and only the grader's configuration holds its URL. Nothing read
from here leaves the grader except aggregate scores.

This module is storage only, that database's tables and its repository (every query of it is a method of
:class:`TestStore`); the rules that use it (drawing the split, scoring, what leaves the grader) are in the grader's
logic modules, and the queries of the grader's main database in :mod:`grader.repository`.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Integer, LargeBinary, String, Text, UniqueConstraint, select
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


class ImportedTask(TestBase):
    """One task of a collection an operator imported (:mod:`grader.imports`): its Harbor folder as a ``.tar.gz``."""

    __tablename__ = "imported_tasks"
    __table_args__ = (UniqueConstraint("collection", "name"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    collection: Mapped[str] = mapped_column(String(64), index=True)
    suite: Mapped[str] = mapped_column(String(40))
    name: Mapped[str] = mapped_column(String(40))
    instruction: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of archive
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    status: Mapped[str] = mapped_column(String(16))  # pending | accepted | refused
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


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

    def answers(self, evaluation_id: str) -> dict[tuple[str, int], str | None]:
        """Answers already recorded for the evaluation, by (item id, sample)."""
        with self.db.session() as s:
            rows = s.execute(select(TestOutcome.item_id, TestOutcome.sample, TestOutcome.answer).where(TestOutcome.evaluation_id == evaluation_id))
            return {(i, k): a for i, k, a in rows}

    def record(self, evaluation_id: str, item_id: str, sample: int, completion: str, answer: str | None, score: float,
               score_error: str | None = None) -> None:
        """Store one sample's outcome; ``score_error``: why the scorer could not score ``answer`` (then ``score`` is 0)."""
        with self.db.session() as s:
            s.add(TestOutcome(evaluation_id=evaluation_id, item_id=item_id, sample=sample, completion=completion, answer=answer, score=score,
                              score_error=score_error))

    def add_collection(self, collection: str, suite: str, tasks: list[dict[str, Any]]) -> bool:
        """Store a new collection's tasks (``{name, instruction, digest, archive, status, reason}`` each) in one
        transaction; ``False`` (and nothing written) when the collection exists."""
        with self.db.session() as s:
            if s.scalar(select(ImportedTask.pk).where(ImportedTask.collection == collection).limit(1)) is not None:
                return False
            now = dt.datetime.now(dt.UTC)
            s.add_all(ImportedTask(collection=collection, suite=suite, created_at=now, **t) for t in tasks)
            return True

    def collection(self, collection: str, *, with_archives: bool = False) -> list[ImportedTask]:
        """The collection's tasks by name (their ``archive`` loaded only ``with_archives``); ``[]`` if there is none."""
        from sqlalchemy.orm import defer

        with self.db.session() as s:
            query = select(ImportedTask).where(ImportedTask.collection == collection).order_by(ImportedTask.name)
            rows = list(s.scalars(query if with_archives else query.options(defer(ImportedTask.archive))))
            s.expunge_all()
            return rows

    def collections(self) -> list[str]:
        """Every collection's name, in order."""
        with self.db.session() as s:
            return list(s.scalars(select(ImportedTask.collection).distinct().order_by(ImportedTask.collection)))

    def pending_collections(self) -> list[str]:
        """The collections with a task not validated yet."""
        with self.db.session() as s:
            return list(s.scalars(select(ImportedTask.collection).where(ImportedTask.status == "pending").distinct()))

    def judge(self, collection: str, name: str, status: str, reason: str | None) -> None:
        """Record a task's validation: ``accepted`` or ``refused`` with ``reason``."""
        with self.db.session() as s:
            row = s.scalar(select(ImportedTask).where(ImportedTask.collection == collection, ImportedTask.name == name))
            if row is not None:
                row.status, row.reason = status, reason
