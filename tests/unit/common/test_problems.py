"""The problem+json of a request that failed validation: which field it names and what it says."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from services.common.app import validation_problem


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
