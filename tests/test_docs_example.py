"""The Python API example of docs/runs.md, run as the script a user saves it as: Dask's
worker processes start by importing the script again, so it must work as one."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from support import REPO

pytestmark = pytest.mark.slow


def api_example() -> str:
    text = (REPO / "docs" / "runs.md").read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_python_api_example_runs_as_a_script(tmp_path):
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "scripted.toml", tmp_path / "examples")
    (tmp_path / "example.py").write_text(api_example())
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    ledger = json.loads((tmp_path / "results" / "five" / "run.json").read_text())
    assert ledger["state"] == "finished" and len(ledger["rounds"]) == 5
