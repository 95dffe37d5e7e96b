"""The problem+json of a request that failed validation: which field it names and what it says; strict JSON bodies."""

from __future__ import annotations

import datetime as dt
import enum
import json
from typing import Annotated, Literal

import pytest
from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field, ValidationError

from services.common.app import StrictBodyRoute, create_service_app, validation_problem


class Hyper(BaseModel):
    n_epochs: Literal["auto"] | Annotated[int, Field(ge=1, le=50)] = "auto"


class Body(BaseModel):
    hyperparameters: Hyper


def problem_of(body: dict) -> dict:
    with pytest.raises(ValidationError) as exc:
        Body.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.value.errors()]
    return validation_problem(RequestValidationError(errors, body=body), 400)


@pytest.mark.parametrize(("value", "says"), [(0, "greater than or equal to 1"), (51, "less than or equal to 50"),
                                             ("many", "valid integer")])
def test_a_value_no_member_of_a_union_takes_is_told_by_the_member_that_is_not_a_literal(value: object, says: str) -> None:
    """``"auto" | 1..50`` sent 0 once answered "Input should be 'auto'", which hides the range the client missed."""
    body = problem_of({"hyperparameters": {"n_epochs": value}})
    assert body["field"] == "hyperparameters.n_epochs" and says in body["detail"], body["detail"]
    assert body["error"]["param"] == "hyperparameters.n_epochs" and len(body["errors"]) == 2


# --------------------------------------------------------------------------- strict bodies (StrictBodyRoute)


class Kind(enum.Enum):
    sft = "sft"


class Inner(BaseModel):
    steps: int = 1


class StrictBody(BaseModel):
    limit: int | None = None
    stream: bool = False
    temperature: float = 1.0
    name: str = "x"
    kind: Kind = Kind.sft
    at: dt.datetime | None = None
    inner: Inner = Inner()
    stop: list[str] = []


@pytest.fixture(scope="module")
def strict_app() -> TestClient:
    app = create_service_app("strict-test", title="t", description="d")
    router = APIRouter(route_class=StrictBodyRoute)

    @router.post("/things")
    def things(body: StrictBody) -> dict:
        return body.model_dump(mode="json")

    app.include_router(router)
    return TestClient(app)


@pytest.mark.parametrize(("body", "field"), [
    ({"limit": "1"}, "limit"), ({"limit": 1.5}, "limit"), ({"limit": True}, "limit"), ({"stream": 1}, "stream"),
    ({"stream": "true"}, "stream"), ({"temperature": "0.5"}, "temperature"), ({"name": 3}, "name"),
    ({"inner": {"steps": "4"}}, "inner.steps"), ({"stop": ["a", 1]}, "stop.1"), ({"kind": "dpo"}, "kind"),
])
def test_a_value_of_the_wrong_json_type_is_refused_not_coerced(strict_app: TestClient, body: dict, field: str) -> None:
    response = strict_app.post("/things", json=body)
    assert response.status_code == 422 and response.json()["field"] == field, response.text


def test_json_s_own_types_and_strings_for_enums_and_dates_still_read(strict_app: TestClient) -> None:
    body = {"limit": 2, "stream": True, "temperature": 0, "name": "n", "kind": "sft", "at": "2026-12-07T04:00:00Z", "inner": {"steps": 3}, "stop": ["a"]}
    response = strict_app.post("/things", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert {k: v for k, v in out.items() if k != "at"} == {k: v for k, v in body.items() if k != "at"} and out["at"].startswith("2026-12-07T04:00:00")


@pytest.mark.parametrize("body", [[{"limit": 1}], "limit", 3, None])
def test_a_body_that_is_not_an_object_names_the_body(strict_app: TestClient, body: object) -> None:
    response = strict_app.post("/things", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["field"] == "body", response.text
