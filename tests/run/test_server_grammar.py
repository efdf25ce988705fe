"""A run that starts llama.cpp servers taking llguidance grammars, with
`agents.openai.constraint = "auto"` (GBNF), says so before anything starts and names the
fix; `simpipe validate` says the same. Other constraints, kinds and answers stay silent."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_server_slots import SERVED, config_on_slurm, served_by_llamacpp, validate_warnings

from simpipe.cluster.server_kinds import SERVER_KINDS
from simpipe.run.executor import Executor
from simpipe.run.server_grammar import slower_grammar
from simpipe.run.server_slots import oversubscribed_slots

FIX = 'set agents.openai.constraint = "lark"'


def test_servers_of_this_install_take_llguidance() -> None:
    # PyPI's xllamacpp wheel is built with llguidance; the warning below rests on it.
    assert SERVER_KINDS["llamacpp"].takes_llguidance()
    assert not SERVER_KINDS["vllm"].takes_llguidance()  # the kind does not say


def test_gbnf_to_llguidance_servers_is_named_with_its_fix(tmp_path: Path) -> None:
    warning = slower_grammar(served_by_llamacpp(tmp_path))
    assert warning is not None
    assert warning.startswith('agents.openai.constraint = "auto" sends the answer grammar as '
                              'GBNF, and the cluster.servers.kind = "llamacpp" servers')
    assert "1.4 times the requests a second" in warning and warning.endswith(FIX)
    # The fix it names is silent.
    assert slower_grammar(served_by_llamacpp(tmp_path, openai={"constraint": "lark"})) is None


@pytest.mark.parametrize("constraint", ["grammar", "json_schema", "none"])
def test_a_constraint_chosen_in_the_config_is_left_alone(tmp_path: Path,
                                                          constraint: str) -> None:
    assert slower_grammar(served_by_llamacpp(tmp_path, openai={"constraint": constraint})) is None


def test_chain_of_thought_has_no_llguidance_form_and_no_warning(tmp_path: Path) -> None:
    config = served_by_llamacpp(tmp_path)
    raw = config.model_dump(mode="json")
    raw["game"]["prompt"] = "cot"
    assert slower_grammar(type(config).model_validate(raw)) is None


@pytest.mark.parametrize("servers", [
    {"kind": "vllm", "model": "m"},  # vLLM takes the regex "auto" sends beside GBNF
    {"kind": "custom", "command": "my-server --port {port}"},  # its build is its own
])
def test_other_server_kinds_get_no_warning(tmp_path: Path, servers: dict) -> None:
    assert slower_grammar(config_on_slurm(tmp_path, servers)) is None


def test_a_run_says_it_before_anything_starts(tmp_path: Path) -> None:
    said: list[str] = []
    config = served_by_llamacpp(tmp_path, cluster={"jobs": 2})
    Executor(config, say=said.append)  # starts nothing
    assert [line for line in said if line.startswith("warning: ")] == [
        f"warning: {oversubscribed_slots(config)}", f"warning: {slower_grammar(config)}"]


def test_validate_says_it() -> None:
    served = (*SERVED, "--set", "agents.openai.max_concurrency=4")  # the slots fit
    warnings = validate_warnings(*served)
    assert len(warnings) == 1 and warnings[0].endswith(FIX)
    assert validate_warnings(*served, "--set", 'agents.openai.constraint="lark"') == []
