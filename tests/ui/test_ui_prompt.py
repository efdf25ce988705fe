"""The UI's prompt route: an agent's prompt, rebuilt from a real LLM run's files (a stub
server answered it), served as JSON; bad queries are one clear error."""

from __future__ import annotations

import json

import pytest

from simpipe.run.agent_prompt import rebuild_prompt
from simpipe.run.console import Console
from simpipe.run.simulation import run_simulation
from simpipe.servers.stub import StubProcess

from support import small_config
from uiserver import ServerThread, raw_request


@pytest.fixture(scope="module")
def results(tmp_path_factory, dask_client):
    root = tmp_path_factory.mktemp("ui-prompt")
    with StubProcess() as stub:
        for name, backend in (("stubbed", "tgi"), ("rules", "scripted")):
            config = small_config(root, run={"name": name},
                                  population={"size": 60, "partitions": 3},
                                  game={"rounds": 3},
                                  agents={"backend": backend, "tgi": {"endpoints": [stub.url]}})
            run_simulation(config, client=dask_client, console=Console(quiet=True))
    return root / "results"


def get(srv: ServerThread, path: str) -> tuple[int, dict]:
    status, _, body = raw_request(srv.port, "GET", path)
    return status, json.loads(body)


def test_the_route_serves_the_rebuilt_prompt(results):
    with ServerThread(results) as srv:
        status, data = get(srv, "/api/runs/stubbed/prompt?agent=19&round=3")
        assert status == 200
        assert data["text"] == data["prompt"] == rebuild_prompt(results / "stubbed", 19, 2).prompt
        assert (data["agent_id"], data["round"], data["rounds_total"]) == (19, 3, 3)
        assert data["tokens_in"] > 0 and data["style"] == "completion"


@pytest.mark.parametrize(("path", "status", "message"), [
    ("/api/runs/stubbed/prompt?agent=x", 400, "whole numbers"),
    ("/api/runs/stubbed/prompt", 400, "whole numbers"),
    ("/api/runs/stubbed/prompt?agent=99", 404, "agents 0 to 59"),
    ("/api/runs/stubbed/prompt?agent=0&round=0", 404, "rounds 1 to 3"),
    ("/api/runs/rules/prompt?agent=0", 404, "they get no prompt"),
    ("/api/runs/nope/prompt?agent=0", 404, "not found"),
])
def test_bad_queries_are_one_clear_error(results, path, status, message):
    with ServerThread(results) as srv:
        got, data = get(srv, path)
        assert got == status and message in data["error"]
