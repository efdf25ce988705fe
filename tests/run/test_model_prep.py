"""A first run on a fresh machine prepares the default model itself, before its rounds, and
says so; a run on a machine where it is ready says nothing of it."""

from __future__ import annotations

import pytest

from simpipe.inference.llamacpp.model_files import default_model_ready, engine_model_path
from simpipe.run.console import Console
from simpipe.run.model_prep import prepare_default_model, uses_default_model
from simpipe.run.simulation import run_simulation
from simpipe.store.results import read_rounds

from support import small_config


class _Lines(Console):
    """A quiet console that keeps what it was told."""

    def __init__(self) -> None:
        super().__init__(quiet=True)
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def line(self, text: str) -> None:
        super().line(text)
        self.lines.append(text)

    def warn(self, text: str) -> None:
        super().warn(text)
        self.warnings.append(text)


def test_which_runs_load_the_default_model(tmp_path):
    model = str(engine_model_path())  # a GGUF file of the suite's home, named as a user would
    assert not uses_default_model(small_config(tmp_path))  # scripted agents
    assert uses_default_model(small_config(tmp_path, agents={"backend": "llamacpp"}))
    assert not uses_default_model(small_config(
        tmp_path, agents={"backend": "llamacpp", "llamacpp": {"model_path": model}}))
    # Scripted agents, but the personas are written by the embedded model.
    assert uses_default_model(small_config(
        tmp_path, population={"size": 8, "partitions": 1, "persona": {"mode": "llm"}}))
    assert not uses_default_model(small_config(
        tmp_path, population={"size": 8, "partitions": 1, "persona": {
            "mode": "llm", "agents": {"backend": "llamacpp",
                                      "llamacpp": {"model_path": model}}}}))


def test_a_home_that_cannot_be_written_is_a_warning_not_a_failed_run(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SIMPIPE_HOME", str(blocker / "home"))
    said = _Lines()
    prepare_default_model(small_config(tmp_path, agents={"backend": "llamacpp"}),
                          said.line, said.warn)
    assert len(said.lines) == 1 and said.lines[0].startswith("preparing the default model")
    assert len(said.warnings) == 1 and "each worker will" in said.warnings[0]
    assert str(blocker) in said.warnings[0]


@pytest.mark.llm
@pytest.mark.slow
def test_a_first_run_prepares_the_default_model_before_its_rounds(dask_client, tmp_path,
                                                                   monkeypatch):
    # The client's home is fresh (the workers keep the suite's, where the model is ready):
    # what is asserted is the client's part, the step and its lines.
    monkeypatch.setenv("SIMPIPE_HOME", str(tmp_path / "home"))
    assert not default_model_ready()

    def config(name: str):
        return small_config(tmp_path / name, population={"size": 8, "partitions": 1},
                            game={"rounds": 1},
                            agents={"backend": "llamacpp", "llamacpp": {"n_parallel": 8}})

    first = _Lines()
    run_simulation(config("first"), client=dask_client, console=first)
    about = [i for i, text in enumerate(first.lines) if "default model" in text]
    assert len(about) == 1, first.lines
    assert first.lines[about[0]].startswith("preparing the default model for this machine")
    ready = first.lines[about[0] + 1]
    assert ready.startswith("  ready in ") and ready.endswith(str(engine_model_path()))
    round_line = next(i for i, text in enumerate(first.lines) if text.startswith("round 1/1"))
    assert about[0] + 1 < round_line
    assert default_model_ready()
    assert (read_rounds(config("first").run_dir)["status"] == "ok").all()

    again = _Lines()
    run_simulation(config("again"), client=dask_client, console=again)
    assert not [text for text in again.lines if "default model" in text], again.lines
