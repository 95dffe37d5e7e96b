"""The migrations that renamed the grader's benchmarks to grading tasks keep every row: the table, the columns that
point at it (in the grader's database and in the test store) and the stored spec's key, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from grader import teststore
from grader.models import Evaluation, GradingTask, Submission, ValidationItem
from services.common.db import Database

GRADER = Path(__file__).resolve().parents[3] / "grader"
BEFORE = "8165a11feef4"  # the grader database's revision before the rename
STORE_BEFORE, STORE_AFTER = "e39a51a2124f", "eef698a1e946"
SPEC = {"benchmark_id": "bm_old", "task": "main", "suite": {"name": "reasoning_gym", "params": {}, "splits": {}}}


def _alembic(url: str, folder: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(GRADER / folder))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def _rows(url: str, sql: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql))]
    finally:
        engine.dispose()


def test_the_grader_databases_rows_survive_the_rename_both_ways(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'grader.sqlite'}"
    cfg = _alembic(url, "migrations")
    command.upgrade(cfg, BEFORE)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO benchmarks (id, spec, created_at) VALUES ('bm_old', :spec, '2026-11-30 00:00:00')"), {"spec": json.dumps(SPEC)})
        conn.execute(sa.text("INSERT INTO validation_items (benchmark_id, item_id, position, question, answer, entry) "
                             "VALUES ('bm_old', 'i0', 0, 'q', 'a', '{}')"))
        conn.execute(sa.text("INSERT INTO evaluations (id, run_id, benchmark_id, purpose, split, model, harness, status, items_total, items_done, "
                             "attempts, created_at) VALUES ('eval_old', 'run_old', 'bm_old', 'validation', 'validation', 'm', '{}', 'succeeded', "
                             "1, 1, 1, '2026-11-30 00:00:00')"))
        conn.execute(sa.text("INSERT INTO submissions (id, run_id, benchmark_id, model, harness, evaluation_id, created_at) "
                             "VALUES ('sub_old', 'run_old', 'bm_old', 'm', '{}', 'eval_old', '2026-11-30 00:00:00')"))
    engine.dispose()

    command.upgrade(cfg, "head")  # the rename and every later revision: the ORM reads the newest schema
    db = Database(url)
    with db.session() as s:
        task = s.get(GradingTask, "bm_old")
        assert task is not None and task.spec == {**{k: v for k, v in SPEC.items() if k != "benchmark_id"}, "task_id": "bm_old"}
        assert [v.task_id for v in s.scalars(sa.select(ValidationItem))] == ["bm_old"]
        assert s.get(Evaluation, "eval_old").task_id == s.get(Submission, "sub_old").task_id == "bm_old"  # type: ignore[union-attr]
    db.engine.dispose()

    command.downgrade(cfg, BEFORE)
    [(spec,)] = _rows(url, "SELECT spec FROM benchmarks")
    assert json.loads(spec) == SPEC
    assert _rows(url, "SELECT benchmark_id FROM validation_items") == _rows(url, "SELECT benchmark_id FROM evaluations") == [("bm_old",)]
    assert _rows(url, "SELECT benchmark_id FROM submissions") == [("bm_old",)]


def test_the_test_stores_items_survive_the_rename_both_ways(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'teststore.sqlite'}"
    cfg = _alembic(url, "teststore_migrations")
    command.upgrade(cfg, STORE_BEFORE)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO test_items (benchmark_id, item_id, position, question, answer, entry) VALUES ('bm_old', 'i0', 0, 'q', 'a', '{}')"))
    engine.dispose()

    command.upgrade(cfg, STORE_AFTER)
    db = Database(url)
    with db.session() as s:
        assert [(t.task_id, t.item_id) for t in s.scalars(sa.select(teststore.TestItem))] == [("bm_old", "i0")]
    db.engine.dispose()
    command.downgrade(cfg, STORE_BEFORE)
    assert _rows(url, "SELECT benchmark_id, item_id FROM test_items") == [("bm_old", "i0")]
