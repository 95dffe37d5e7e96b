"""Registering a base model without a restart: the operator's card through ``POST /admin/models`` (the gateway app in
this process), forwarded to inference's ``POST /internal/base-models`` (the inference app in this process, on a models
folder of its own), prepared there and served at once; ``crucible admin add-model`` doing the same from a YAML file.
The model registered is a Hugging Face folder copied from the prepared SmolLM2 (real weights, real engine)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from inference_service.app import create_app
from inference_service.client import InferenceClient
from inference_service.service import Inference
from inference_service.settings import InferenceSettings
from typer.testing import CliRunner

from crucible import cli
from crucible.sdk import AdminClient
from gateway.app import create_app as create_gateway_app
from gateway.settings import GatewaySettings
from services.common.errors import UpstreamProblem
from services.common.http import AsyncServiceClient
from services.common.llms import CARD_FILE, HFFolderSource, ModelCard, prepare_model, registry
from services.common.openai_protocol import ChatCompletionRequest, ChatMessage
from services.ledger.client import LedgerClient
from tests.conftest import prepared_models
from tests.unit.inference.conftest import GATEWAY_TOKEN, INFERENCE_TOKEN, MODEL, run
from tests.unit.inprocess import in_process

ADMIN_KEY = "admin-key-for-model-registration"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


@dataclass
class Served:
    inference: InferenceClient  # as the gateway calls it
    service: Inference
    gateway: TestClient  # the gateway app, its inference client reaching the inference app above
    models_dir: Path
    inference_http: TestClient


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, ledger: LedgerClient) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("registry")
    (data_dir / "models").mkdir()
    (data_dir / "models" / MODEL).symlink_to(prepared_models(MODEL) / MODEL, target_is_directory=True)
    settings = InferenceSettings(data_dir=data_dir, service_token=INFERENCE_TOKEN, trusted_tokens={"gateway": GATEWAY_TOKEN})
    gateway_settings = GatewaySettings(data_dir=data_dir / "gateway", admin_key=ADMIN_KEY, service_token=GATEWAY_TOKEN, rate_limits="")
    with TestClient(create_app(settings), base_url="http://inference") as http, \
            TestClient(create_gateway_app(gateway_settings), base_url="http://gateway") as gateway:
        service: Inference = http.app.state.inference  # type: ignore[attr-defined]
        service.ledger.close()
        service.ledger = ledger
        transport = AsyncServiceClient("http://inference", GATEWAY_TOKEN, name="inference")
        transport.client = httpx.AsyncClient(base_url="http://inference", headers=transport.client.headers,
                                             transport=httpx.ASGITransport(app=http.app))
        gateway.app.state.gateway.inference = InferenceClient(transport)  # type: ignore[attr-defined]
        yield Served(InferenceClient(in_process(http, GATEWAY_TOKEN, "inference")), service, gateway, data_dir / "models", http)
        service.ledger = LedgerClient.connect(settings)  # the app closes its clients on shutdown; the shared ledger stays open


def card_doc(name: str, **extra: object) -> dict:
    return {"name": name, "source": {"kind": "hf_folder", "path": str(prepared_models(MODEL) / MODEL)}, **extra}


def ask(model: str, max_tokens: int = 3) -> ChatCompletionRequest:
    return ChatCompletionRequest(model=model, messages=[ChatMessage(role="user", content="What is 2 + 3?")], max_tokens=max_tokens, temperature=0)


def test_the_admin_api_registers_a_model_and_it_is_served_without_a_restart(served: Served, ledger: LedgerClient) -> None:
    before = set(served.service.engines)
    resp = served.gateway.post("/admin/models", json=card_doc("smol-plain", chat_template=TEMPLATE, context_tokens=64,
                                                              prices={"decode_tokens": 800_000}), headers=ADMIN)
    assert resp.status_code == 201, resp.text
    assert resp.json()["name"] == "smol-plain" and resp.json()["context_tokens"] == 64
    assert set(served.service.engines) == before | {"smol-plain"}  # the same process, one engine more
    assert [m.id for m in served.inference.list_models().data] == [MODEL, "smol-plain"]
    assert [m["name"] for m in served.gateway.get("/admin/models", headers=ADMIN).json()["data"]] == ["smol-plain", MODEL]  # by name
    assert (served.models_dir / "smol-plain" / CARD_FILE).is_file() and list(registry(served.models_dir)) == ["smol-plain", MODEL]

    table = ledger.prices()
    assert {(p.kind, p.usd_micros_per_million_units) for p in table.prices if p.model == "smol-plain"} == {("decode_tokens", 800_000)}
    assert "+" in table.version  # prices.yaml's version and the registered rows'

    ctx = run(ledger, "run_registered")
    out = served.inference.chat_completions(ctx, ask("smol-plain"))
    assert out.model == "smol-plain" and out.usage.completion_tokens >= 1
    (decode,) = [e for e in ledger.list_entries(ctx.run_id) if e.type == "charge" and e.kind == "decode_tokens"]
    assert (decode.model, decode.quantity, decode.price_version) == ("smol-plain", out.usage.completion_tokens, table.version)
    assert decode.amount_usd_micros == -(-out.usage.completion_tokens * 800_000 // 1_000_000)  # the card's price, not the "*" row
    engine = served.service.engines["smol-plain"]
    assert engine.renderer.render([{"role": "user", "content": "hi"}]) == "user: hi\nassistant:"  # type: ignore[attr-defined]
    with pytest.raises(UpstreamProblem) as exc:  # the card's context cap, not SmolLM2's 8192
        served.inference.chat_completions(ctx, ask("smol-plain", max_tokens=60))
    assert (exc.value.code, exc.value.problem["context_tokens"]) == ("context_exceeded", 64)

    again = served.gateway.post("/admin/models", json=card_doc("smol-plain", chat_template=TEMPLATE, context_tokens=128), headers=ADMIN)
    assert again.status_code == 201 and served.service.cards["smol-plain"].context_tokens == 128  # metadata may change
    conflict = served.gateway.post("/admin/models", json=card_doc("smol-plain"), headers=ADMIN)  # another chat template: another model
    assert (conflict.status_code, conflict.json()["field"]) == (409, "name")


def test_a_model_another_replica_registered_is_listed_and_served_on_first_use(served: Served, ledger: LedgerClient) -> None:
    prepare_model(ModelCard(name="smol-elsewhere", source=HFFolderSource(path=prepared_models(MODEL) / MODEL)), served.models_dir)
    assert "smol-elsewhere" not in served.service.engines  # written into the shared folder, not by this process
    assert "smol-elsewhere" in [m.id for m in served.inference.list_models().data]
    assert "smol-elsewhere" in [c.name for c in served.inference.list_base_models().data]
    out = served.inference.chat_completions(run(ledger, "run_elsewhere"), ask("smol-elsewhere"))
    assert out.model == "smol-elsewhere" and "smol-elsewhere" in served.service.engines


@pytest.mark.parametrize(("doc", "status", "field"), [
    ({"name": "x", "source": {"kind": "hf_folder"}}, 422, "source.path"),  # the gateway's own check of the card
    ({"name": "x", "source": {"kind": "ftp", "path": "/x"}}, 422, "source"),
    ({"name": "X Y", "source": {"kind": "hf_folder", "path": "/x"}}, 422, "name"),
    ({"name": "x", "source": {"kind": "hf_folder", "path": "/x"}, "context_tokens": 0}, 422, "context_tokens"),
    ({"name": "x", "source": {"kind": "hf_folder", "path": "/nowhere"}}, 422, "source.path"),  # inference's, preparing it
    ({"name": "x", "source": {"kind": "package_gguf", "package": "not_installed_pkg", "glob": "*.gguf"}}, 422, "source.package"),
])
def test_a_bad_card_is_a_422_naming_the_field(served: Served, doc: dict, status: int, field: str) -> None:
    resp = served.gateway.post("/admin/models", json=doc, headers=ADMIN)
    assert (resp.status_code, resp.headers["content-type"]) == (status, "application/problem+json"), resp.text
    assert resp.json()["field"] == field and resp.json()["detail"].startswith(field)
    assert "x" not in served.service.engines and not (served.models_dir / "x").exists()


def test_the_model_routes_answer_only_the_admin_key_and_trusted_services(served: Served) -> None:
    assert served.gateway.post("/admin/models", json=card_doc("smol-x"), headers={"Authorization": ""}).status_code == 401
    assert served.gateway.get("/admin/models", headers={"Authorization": "Bearer crk_agent"}).status_code == 401
    for method in ("GET", "POST"):
        resp = served.inference_http.request(method, "/internal/base-models", json=card_doc("smol-x"), headers={"Authorization": f"Bearer {INFERENCE_TOKEN}"})
        assert resp.status_code == 401
    assert "smol-x" not in served.service.engines


def test_crucible_admin_add_model_registers_a_card_file(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "weights").symlink_to(prepared_models(MODEL) / MODEL, target_is_directory=True)
    card = tmp_path / "card.yaml"
    card.write_text(yaml.safe_dump({"name": "smol-cli", "source": {"kind": "hf_folder", "path": "weights"}, "description": "from the CLI"}))
    admin = AdminClient("http://gateway", ADMIN_KEY)
    admin.http = served.gateway
    served.gateway.headers.update(ADMIN)
    monkeypatch.setattr(cli, "_admin", lambda _gateway, _data_dir: admin)
    out = CliRunner().invoke(cli.app, ["admin", "add-model", str(card)])
    assert out.exit_code == 0, out.output
    assert "smol-cli registered and served" in out.output
    assert served.service.cards["smol-cli"] == ModelCard(name="smol-cli", source=HFFolderSource(path=(tmp_path / "weights").resolve()),
                                                         description="from the CLI")
    listed = CliRunner().invoke(cli.app, ["admin", "models"])
    assert listed.exit_code == 0 and "smol-cli" in listed.output and "hf_folder" in listed.output
    bad = CliRunner().invoke(cli.app, ["admin", "add-model", "no-such-model-or-file"])
    assert bad.exit_code == 1 and "gemma3-270m" in bad.output
    card.write_text(yaml.safe_dump({"name": "smol-cli2", "source": {"kind": "hf_folder"}}))
    bad = CliRunner().invoke(cli.app, ["admin", "add-model", str(card)])
    assert bad.exit_code == 1 and "source.path" in bad.output
