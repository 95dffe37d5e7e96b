"""Datasets: a run's JSONL uploads, validated by ``trainer_service.schemas.parse_dataset`` and stored
content-addressed (``artifacts/datasets/<sha256>.jsonl``), immutable once stored."""

from __future__ import annotations

import hashlib

from trainer_service import repository
from trainer_service.models import Dataset
from trainer_service.schemas import ParsedDataset, parse_dataset
from trainer_service.service import Trainer

from services.common import artifacts
from services.common.auth import RunContext
from services.common.contracts import DatasetOut
from services.common.errors import Unprocessable
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
        existing = repository.dataset_by_digest(s, ctx, digest)
        if existing is not None:
            return _dataset_out(existing)
        return _dataset_out(repository.add_dataset(s, ctx, new_id("ds"), name=name, fmt=fmt, sha256=digest, rows=rows, size=len(data), uri=uri))


def list_datasets(trainer: Trainer, ctx: RunContext) -> list[DatasetOut]:
    """The run's datasets, oldest first."""
    with trainer.db.session() as s:
        return [_dataset_out(d) for d in repository.run_datasets(s, ctx)]


def get_dataset(trainer: Trainer, ctx: RunContext, dataset_id: str) -> DatasetOut:
    """The run's dataset; another run's or an unknown id → ``NotFound``."""
    with trainer.db.session() as s:
        return _dataset_out(repository.owned_dataset(s, ctx, dataset_id))


def dataset_content(trainer: Trainer, ctx: RunContext, dataset_id: str) -> bytes:
    """The stored JSONL bytes of the run's dataset; ``NotFound`` for another run's or an unknown id."""
    with trainer.db.session() as s:
        uri = repository.owned_dataset(s, ctx, dataset_id).uri
    return artifacts.local_path(uri).read_bytes()


def read_dataset(ds: Dataset) -> ParsedDataset:
    """A stored dataset's rows, validated again by the upload's rules; ``Unprocessable`` naming the dataset,
    ``line`` and ``field`` if it no longer passes them."""
    try:
        return parse_dataset(artifacts.local_path(ds.uri).read_bytes())
    except Unprocessable as exc:
        raise Unprocessable(f"dataset {ds.id}: {exc.detail}", dataset=ds.id, **exc.extra) from None
