"""``simpipe engine``: the installed engine's build is described truthfully, an engine built for
instructions a CPU lacks is refused before llama.cpp loads (with the fix), and ``simpipe
engine build`` really compiles the pinned release for this CPU, a run uses it, and
``--prebuilt`` puts PyPI's wheel back (in a virtual environment of the test's own, so the
suite's engine is never touched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from simpipe.inference.llamacpp.native_build import (
    ENGINE_RELEASE,
    EngineBuild,
    EngineBuildError,
    check_cpu,
    check_loads,
    compiled_instruction_sets,
    cpu_flags,
    engine_module,
    installed_engine,
    unused_instruction_sets,
)

from support import REPO


def _cpuinfo(tmp_path: Path, flags: set[str]) -> frozenset[str] | None:
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: test\nflags\t\t: "
                    + " ".join(sorted(flags)) + "\n\n")
    return cpu_flags(path)


def test_the_installed_engines_instruction_sets_are_the_ones_llama_cpp_reports() -> None:
    # PyPI's wheel: the declared AVX2-and-below sets; a build here: its record. Either way
    # what `simpipe engine show` and run.json say must be what the loaded library reports.
    build = installed_engine()
    assert build.release == ENGINE_RELEASE
    assert build.compiled_for == compiled_instruction_sets(engine_module().get_system_info())
    assert ENGINE_RELEASE in build.describe()


def test_system_info_parsing_keeps_the_sets_compiled_in() -> None:
    line = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 0 | AVX2 = 1 | F16C = 1 | "
            "FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | LLAMAFILE = 1 | ")
    assert compiled_instruction_sets(line) == ("AVX", "AVX2", "F16C", "FMA", "BMI2",
                                               "AVX512", "AVX512_VNNI")


def test_an_engine_built_for_instructions_this_cpu_lacks_is_refused_with_the_fix(
        tmp_path: Path) -> None:
    built = EngineBuild(ENGINE_RELEASE, built_here=True,
                        compiled_for=("AVX", "AVX2", "FMA", "AVX512", "AVX512_VNNI"))
    older = _cpuinfo(tmp_path, {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"})
    with pytest.raises(EngineBuildError) as refused:
        check_cpu(built, older, "host node7")
    message = str(refused.value)
    assert message.startswith("host node7: ")
    assert "needs AVX512, AVX512_VNNI, which this CPU lacks" in message
    assert "`simpipe engine build`" in message and "`simpipe engine build --prebuilt`" in message
    # The same engine on a CPU that has them, and PyPI's wheel on the older CPU, load.
    check_cpu(built, _cpuinfo(tmp_path, {"avx", "avx2", "fma", "avx512f", "avx512_vnni"}),
              "host node8")
    check_cpu(EngineBuild(ENGINE_RELEASE, built_here=False,
                          compiled_for=("AVX", "AVX2", "F16C", "FMA", "BMI2")), older, "node7")


def test_show_names_what_this_cpu_has_and_the_engine_leaves_unused(tmp_path: Path) -> None:
    prebuilt = EngineBuild(ENGINE_RELEASE, built_here=False,
                           compiled_for=("AVX", "AVX2", "F16C", "FMA", "BMI2"))
    newer = _cpuinfo(tmp_path, {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f",
                                "avx512_vnni", "amx_int8"})
    assert unused_instruction_sets(prebuilt, newer) == ["AVX512", "AVX512_VNNI"]
    assert unused_instruction_sets(prebuilt, None) == []  # no /proc/cpuinfo: nothing claimed


def _wheel(folder: Path, module: str) -> Path:
    """A wheel of xllamacpp at the pinned release whose module is ``module`` (pip installs
    it as it would the one ``simpipe engine build`` compiles)."""
    name = f"xllamacpp-{ENGINE_RELEASE}"
    path = folder / f"{name}-py3-none-any.whl"
    files = {"xllamacpp/__init__.py": module,
             f"{name}.dist-info/METADATA": ("Metadata-Version: 2.1\nName: xllamacpp\n"
                                            f"Version: {ENGINE_RELEASE}\n"),
             f"{name}.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: test\n"
                                         "Root-Is-Purelib: true\nTag: py3-none-any\n")}
    files[f"{name}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + \
        f"{name}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def _installed_engine_loads() -> str:
    done = subprocess.run([sys.executable, "-c", "import xllamacpp; "
                           "print(xllamacpp.get_system_info())"],
                          capture_output=True, text=True, check=True, timeout=120)
    return done.stdout


def test_a_built_engine_that_does_not_load_leaves_the_installed_one_in_place(
        tmp_path: Path) -> None:
    # What `simpipe engine build` does between compiling and installing: the wheel is loaded
    # by a fresh process from a folder of its own; one that fails to import is never
    # installed, and the error carries the import's own words.
    before, info = installed_engine(), _installed_engine_loads()
    log = tmp_path / "engine-build.log"
    broken = _wheel(tmp_path, "raise ImportError('undefined symbol: ggml_test_missing')\n")
    with pytest.raises(EngineBuildError) as caught:
        check_loads(broken, log)
    message = str(caught.value)
    assert "does not load" in message and "installed engine is unchanged" in message
    assert "undefined symbol: ggml_test_missing" in message and str(log) in message
    assert installed_engine() == before and _installed_engine_loads() == info


def test_a_built_engine_that_loads_reports_its_own_instruction_sets(tmp_path: Path) -> None:
    # The sets recorded for a build are the new wheel's, read before it is installed, not
    # those of the engine still installed.
    line = "CPU : AVX = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 0 | "
    good = _wheel(tmp_path, f"def get_system_info():\n    return {line!r}\n")
    got = check_loads(good, tmp_path / "engine-build.log")
    assert compiled_instruction_sets(got) == ("AVX", "AVX2", "AVX512", "AVX512_VNNI")
    assert installed_engine().release == ENGINE_RELEASE
    assert compiled_instruction_sets(_installed_engine_loads()) == installed_engine().compiled_for


@pytest.mark.slow
@pytest.mark.llm
@pytest.mark.timeout(2400)
def test_engine_build_compiles_the_pinned_release_for_this_cpu_and_a_run_uses_it(
        tmp_path: Path) -> None:
    # A venv of its own that sees the suite's packages: the build installs over its own
    # site-packages only (pip leaves packages outside its environment alone).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    own = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    suite = sysconfig.get_paths()["purelib"]
    (own / "suite.pth").write_text(f"import site; site.addsitedir({suite!r})\n")
    env = {**os.environ, "SIMPIPE_HOME": str(tmp_path / "home")}

    def simpipe(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([str(python), "-m", "simpipe.cli", *args], capture_output=True,
                              text=True, cwd=REPO, env=env, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    # One compile job: the suite's other worker keeps its core.
    built = simpipe("engine", "build", "--jobs", "1", timeout=2000)
    assert f"xllamacpp {ENGINE_RELEASE}, built from source for AVX, AVX2" in built.stdout
    flags = cpu_flags() or frozenset()
    if "avx512f" in flags:
        assert "AVX512" in built.stdout.splitlines()[-1]
    shown = simpipe("engine", "show")
    assert "built from source" in shown.stdout and "also has" not in shown.stdout
    assert (tmp_path / "home" / "engine-build.log").stat().st_size > 0

    out = tmp_path / "results"
    simpipe("run", "examples/quickstart.toml", f"--set=run.output_dir={out}",
            "--set=population.size=40", "--set=game.rounds=2")
    record = json.loads((out / "quickstart" / "run.json").read_text())
    assert record["versions"]["xllamacpp build"].startswith(
        f"xllamacpp {ENGINE_RELEASE}, built from source for")
    import pandas as pd

    rounds = pd.read_parquet(out / "quickstart" / "rounds")
    guesses = rounds["guess"].dropna()
    assert len(rounds) == 80 and len(guesses) >= 72 and guesses.between(0, 100).all()

    back = simpipe("engine", "build", "--prebuilt")
    assert back.stdout.splitlines()[-1] == (
        f"engine: xllamacpp {ENGINE_RELEASE}, PyPI's prebuilt wheel (AVX, AVX2, F16C, FMA, BMI2)")
