"""Datasets: a run's JSONL uploads, validated by ``trainer_service.schemas.parse_dataset`` and stored
content-addressed (``artifacts/datasets/<sha256>.jsonl``), immutable once stored."""

from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.orm import Session
from trainer_service.models import Dataset
from trainer_service.schemas import ParsedDataset, parse_dataset
from trainer_service.service import Trainer

from services.common import artifacts
from services.common.auth import RunContext
from services.common.contracts import DatasetOut
from services.common.db import utcnow
from services.common.errors import NotFound, Unprocessable
from services.common.ids import new_id


def _dataset_out(ds: Dataset) -> DatasetOut:
    return DatasetOut(id=ds.id, name=ds.name, format=ds.format, rows=ds.rows, bytes=ds.bytes, sha256=ds.sha256, created_at=ds.created_at)  # type: ignore[arg-type]


def create_dataset(trainer: Trainer, ctx: RunContext, name: str, data: bytes) -> DatasetOut:
    """Validate and store a JSONL upload for the run; the same content uploaded twice returns the first dataset.

    Raises ``Unprocessable`` naming the ``line`` and ``field`` of the first row the trainer could not train
    on (see ``trainer_service.schemas.parse_dataset``).
    """
    parsed = parse_dataset(data)
    fmt, rows = parsed.format, len(parsed.rows)
    digest = hashlib.sha256(data).hexdigest()
    uri = artifacts.put_bytes(trainer.settings.artifacts_dir, artifacts.dataset_key(digest), data)
    with trainer.db.session() as s:
        existing = s.scalar(select(Dataset).where(Dataset.run_id == ctx.run_id, Dataset.sha256 == digest))
        if existing is not None:
            return _dataset_out(existing)
        ds = Dataset(id=new_id("ds"), run_id=ctx.run_id, name=name, format=fmt, sha256=digest, rows=rows, bytes=len(data), uri=uri, created_at=utcnow())
        s.add(ds)
        s.flush()
        return _dataset_out(ds)


def list_datasets(trainer: Trainer, ctx: RunContext) -> list[DatasetOut]:
    """The run's datasets, oldest first."""
    with trainer.db.session() as s:
        return [_dataset_out(d) for d in s.scalars(select(Dataset).where(Dataset.run_id == ctx.run_id).order_by(Dataset.id))]


def get_dataset(trainer: Trainer, ctx: RunContext, dataset_id: str) -> DatasetOut:
    """The run's dataset; another run's or an unknown id → ``NotFound``."""
    with trainer.db.session() as s:
        return _dataset_out(owned_dataset(s, ctx, dataset_id))


def owned_dataset(s: Session, ctx: RunContext, dataset_id: str) -> Dataset:
    """The row of the run's dataset ``dataset_id``; ``NotFound`` (``field="datasets"``) for another run's or an unknown id."""
    ds = s.get(Dataset, dataset_id)
    if ds is None or ds.run_id != ctx.run_id:
        raise NotFound(f"dataset {dataset_id} not found", field="datasets")
    return ds


def dataset_content(trainer: Trainer, ctx: RunContext, dataset_id: str) -> bytes:
    """The stored JSONL bytes of the run's dataset; ``NotFound`` for another run's or an unknown id."""
    with trainer.db.session() as s:
        uri = owned_dataset(s, ctx, dataset_id).uri
    return artifacts.local_path(uri).read_bytes()


def read_dataset(ds: Dataset) -> ParsedDataset:
    """A stored dataset's rows, validated again by the upload's rules; ``Unprocessable`` naming the dataset,
    ``line`` and ``field`` if it no longer passes them."""
    try:
        return parse_dataset(artifacts.local_path(ds.uri).read_bytes())
    except Unprocessable as exc:
        raise Unprocessable(f"dataset {ds.id}: {exc.detail}", dataset=ds.id, **exc.extra) from None
