"""Values `simpipe validate` used to accept and `simpipe run` could not play, and config
files built to break the reader: each is one error line (exit 2) naming the key or the
file, never a traceback, never the whole hostile value echoed back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simpipe.config.model import MAX_CONFIG_BYTES, ConfigError, load_config

from support import SCRIPTED, one_error_line, simpipe_cli

# Every integer that reaches the engine or an HTTP request has an upper bound a real model
# or server can meet: beyond it the value wrapped to int32 (max_tokens: every agent an
# error, exit 0) or overflowed in llama.cpp (n_ctx: OverflowError).
HUGE = str(10**12)


@pytest.mark.parametrize("override,key,allowed", [
    (f"agents.max_tokens={HUGE}", "agents.max_tokens", "less than or equal to 131072"),
    (f"agents.cot_max_tokens={HUGE}", "agents.cot_max_tokens", "less than or equal to 131072"),
    (f"agents.top_k={HUGE}", "agents.top_k", "less than or equal to 1048576"),
    (f"agents.llamacpp.n_ctx={HUGE}", "agents.llamacpp.n_ctx", "less than or equal to 131072"),
    (f"agents.llamacpp.threads={HUGE}", "agents.llamacpp.threads", "less than or equal to 1024"),
    (f"agents.tgi.max_concurrency={HUGE}", "agents.tgi.max_concurrency",
     "less than or equal to 4096"),
    (f"agents.openai.retries={HUGE}", "agents.openai.retries", "less than or equal to 100"),
    ("agents.openai.timeout_s=1e300", "agents.openai.timeout_s", "less than or equal to 86400"),
    ("agents.tgi.backoff_max_s=1e300", "agents.tgi.backoff_max_s",
     "less than or equal to 3600"),
    # A boolean is a TOML boolean: not the word yes, not 1, not the string "true".
    ("agents.reproducible=yes", "agents.reproducible", "valid boolean"),
    ("agents.reproducible=1", "agents.reproducible", "valid boolean"),
    ("agents.reproducible='true'", "agents.reproducible", "valid boolean"),
    ("game.disclose_variant=1", "game.disclose_variant", "valid boolean"),
    ("agents.max_raw_chars=true", "agents.max_raw_chars", "valid integer"),
])
def test_a_value_run_cannot_play_is_refused_by_validate(override, key, allowed):
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED), "--set", override))
    assert key in line and allowed in line, line


def test_values_at_the_new_bounds_validate():
    config = load_config(SCRIPTED, [
        "agents.max_tokens=131072", "agents.cot_max_tokens=131072", "agents.top_k=1048576",
        "agents.llamacpp.n_ctx=131072", "agents.llamacpp.threads=1024",
        "agents.tgi.max_concurrency=4096", "agents.openai.retries=100",
        "agents.openai.timeout_s=86400", "agents.tgi.backoff_max_s=3600",
        "agents.reproducible=true", "game.disclose_variant=false"])
    assert config.agents.max_tokens == 131072 and config.agents.reproducible is True


# --- hostile config files -------------------------------------------------------------------


def _config_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hostile.toml"
    path.write_text(SCRIPTED.read_text() + "\n" + text)
    return path


@pytest.mark.parametrize("text,says", [
    # tomllib recurses once per level: RecursionError
    ("deep = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deep = " + "{a = " * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    # int() refuses more than 4300 digits: ValueError
    ("[extra]\nbig = " + "9" * 5000, "more than 4300 digits"),
])
def test_a_config_file_built_to_break_the_reader_is_one_line(tmp_path, text, says):
    path = _config_with(tmp_path, text)
    line = one_error_line(simpipe_cli("validate", str(path)))
    assert line.startswith(f"error: {path}: not valid TOML: ") and says in line, line[:300]


@pytest.mark.parametrize("value,says", [
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),  # one argument: at most 128 KiB
    ("9" * 5000, "more than 4300 digits"),
])
def test_a_set_value_built_to_break_the_reader_is_one_line(value, says):
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED), "--set", f"game.rounds={value}"))
    assert line.startswith("error: --set 'game.rounds=") and says in line, line[:300]
    assert len(line) < 300


@pytest.mark.parametrize("text", [
    # tomllib takes time in the square of a dotted key's length: hours for these
    "[extra]\n" + "a." * 200_000 + "b = 1",
    "[population.attributes." + "a." * 200_000 + "b]",
    "[game]\nx = {" + '"a".' * 100_000 + "b = 1}",
])
def test_a_dotted_key_built_to_stall_the_reader_is_one_line(tmp_path, text):
    path = tmp_path / "x.toml"
    path.write_text(text)
    line = one_error_line(simpipe_cli("validate", str(path)))
    assert line.startswith(f"error: {path}, line ") and "more than 64 parts" in line, line[:300]


def test_a_dotted_key_in_a_set_value_is_one_line():
    value = "{" + "a." * 50_000 + "b = 1}"
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED), "--set", f"game.x={value}"))
    assert line.startswith("error: --set 'game.x={a.a.") and "more than 64 parts" in line
    assert len(line) < 400


def test_a_config_file_over_the_size_bound_is_refused_unread(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text('[run]\nname = "' + "a" * (50 * 2**20) + '"\n')
    line = one_error_line(simpipe_cli("validate", str(path)))
    assert line == (f"error: {path}: a config file of more than {MAX_CONFIG_BYTES // 2**20} MiB; "
                    "simpipe configs are a few KiB: is this the right file?")


@pytest.mark.parametrize("where", ["file", "set"])
def test_a_long_value_is_echoed_as_a_short_prefix(tmp_path, where):
    name = "x" * 100_000 + "/"  # 100 KB, under the file bound; the '/' makes it invalid
    if where == "file":
        path = tmp_path / "x.toml"
        path.write_text(SCRIPTED.read_text().replace('name = "classic"', f'name = "{name}"'))
        args = [str(path)]
    else:
        args = [str(SCRIPTED), "--set", f"run.name={name}"]
    line = one_error_line(simpipe_cli("validate", *args))
    assert "run.name = 'xxxx" in line and "(100,001 characters)" in line, line[:300]
    assert len(line) < 400


def test_a_long_unknown_key_is_echoed_as_a_short_prefix(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(SCRIPTED.read_text().replace("[game]\n", "[game]\n" + "k" * 100_000 + " = 1\n"))
    line = one_error_line(simpipe_cli("validate", str(path)))
    assert "game.kkkk" in line and "(100,005 characters)" in line, line[:300]
    assert len(line) < 600


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_reading(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "config.toml"
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    else:
        path = Path("/dev/zero")  # endless
    line = one_error_line(simpipe_cli("validate", str(path)))
    assert line == f"error: {path}: not a regular file; pass a TOML config file"


def test_load_config_raises_config_error_for_deep_nesting(tmp_path):
    path = _config_with(tmp_path, "deep = " + "[" * 50_000 + "]" * 50_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(path)


# --- TOML dates and times -------------------------------------------------------------------


def test_walltime_may_be_a_toml_time():
    proc = simpipe_cli("validate", str(SCRIPTED), "--set", 'cluster={kind="slurm"}',
                       "--set", "cluster.walltime=00:30:00")
    assert proc.returncode == 0, proc.stderr
    config = load_config(SCRIPTED, ['cluster={kind="slurm"}', "cluster.walltime=00:30:00"])
    assert config.cluster.walltime == "00:30:00"


def test_a_toml_date_where_text_belongs_says_to_quote_it():
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED),
                                      "--set", "run.output_dir=2024-01-01"))
    assert "run.output_dir = 2024-01-01 (a TOML date)" in line, line
    assert "quote it" in line and "datetime" not in line, line
