"""One error type for every user error, whichever package raises it: the ``simpipe`` group
catches ``SimpipeError`` once and prints one line per problem with the error's exit status,
never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from simpipe.core.errors import IMPORTABLE_EVERYWHERE

from support import REPO, SCRIPTED, one_error_line, simpipe_cli


def test_population_show_of_a_damaged_spec_file_is_one_line(tmp_path: Path) -> None:
    pop = tmp_path / "population"
    pop.mkdir()
    (pop / "_population.json").write_text('{"population": {"size": 10, ')  # cut short
    line = one_error_line(simpipe_cli("population", "show", str(tmp_path)))
    assert line.startswith(f"error: {pop / '_population.json'}: not a population spec")
    assert "simpipe population build CONFIG" in line


def test_sbatch_of_a_config_without_slurm_workers_is_one_line_naming_the_kind(
        tmp_path: Path) -> None:
    script = tmp_path / "s.sbatch"
    line = one_error_line(simpipe_cli("sbatch", str(SCRIPTED), "--output", str(script)))
    assert line == 'error: simpipe sbatch needs cluster.kind = "slurm" (got "local")'
    assert not script.exists()


def test_cluster_up_without_slurm_workers_is_the_same_one_line(tmp_path: Path) -> None:
    """sbatch and cluster up share one check (``simpipe.cluster.slurm.require_slurm``)."""
    env = {**os.environ, "SIMPIPE_HOME": str(tmp_path)}
    line = one_error_line(simpipe_cli("cluster", "up", str(SCRIPTED), "--name", "t", env=env))
    assert line == 'error: simpipe cluster up needs cluster.kind = "slurm" (got "local")'
    assert not (tmp_path / "clusters").exists()


def test_run_on_a_cluster_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "SIMPIPE_HOME": str(tmp_path / "home")}
    proc = simpipe_cli("run", str(SCRIPTED), "--cluster", "nope",
                       "--set", f"run.output_dir={tmp_path / 'results'}", env=env)
    assert one_error_line(proc).startswith("error: no cluster named 'nope'")
    assert not (tmp_path / "results").exists()


def test_a_key_of_another_cluster_kind_is_one_line_naming_the_key_and_the_kind() -> None:
    line = one_error_line(simpipe_cli("validate", str(SCRIPTED), "--set", "cluster.queue=gpu"))
    assert line.startswith(f"error: {SCRIPTED}: unknown key 'cluster.queue' for "
                           "cluster.kind = 'local'; allowed here: kind, ")
    assert "workers" in line and "walltime" not in line
    assert line.endswith("""(to change the kind with --set, replace the section: --set """
                         """'cluster={kind="local", ...}')""")
    # The file's local keys under another kind: one line each, the way out in each.
    slurm = simpipe_cli("validate", str(SCRIPTED), "--set", 'cluster.kind="slurm"')
    assert slurm.returncode == 2 and "Traceback" not in slurm.stderr
    assert [line.split(";")[0] for line in slurm.stderr.splitlines()] == [
        f"error: {SCRIPTED}: unknown key 'cluster.{key}' for cluster.kind = 'slurm'"
        for key in ("workers", "threads_per_worker")]
    replaced = simpipe_cli("validate", str(SCRIPTED), "--set", 'cluster={kind="slurm"}')
    assert replaced.returncode == 0, replaced.stderr


def test_a_scheduler_by_address_takes_its_own_keys_and_starts_no_server_jobs(
        tmp_path: Path) -> None:
    cfg = tmp_path / "address.toml"
    cfg.write_text('[cluster]\nkind = "address"\naddress = "tcp://127.0.0.1:1"\n')
    assert simpipe_cli("validate", str(cfg)).returncode == 0
    line = one_error_line(simpipe_cli("validate", str(cfg), "--set", "cluster.workers=3"))
    assert "unknown key 'cluster.workers' for cluster.kind = 'address'" in line
    line = one_error_line(simpipe_cli("validate", str(cfg), "--set",
                                      'cluster.servers={kind="vllm", model="m"}'))
    assert line.endswith('cluster: cluster.servers.kind = "vllm" needs cluster.kind = "slurm" '
                         '(servers run as SLURM jobs); set cluster.servers.kind = "none" with '
                         'cluster.kind = "address" (emulated servers also run as local '
                         'processes)')


def test_the_error_module_imports_nothing_of_simpipe() -> None:
    """Every package may derive its errors from it without importing the pipeline."""
    code = ("import sys, json, simpipe.core.errors; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('simpipe'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert json.loads(out) == ["simpipe", "simpipe.core", IMPORTABLE_EVERYWHERE]
    assert IMPORTABLE_EVERYWHERE == "simpipe.core.errors"
