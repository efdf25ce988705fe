"""The embedded engine's build: which one is installed, loading it safely, and building it
for this CPU (``simpipe engine``).

PyPI's xllamacpp wheel is compiled for any x86-64 CPU with AVX2, so a CPU with AVX-512 and
VNNI leaves them unused. Built from the same release's source for this CPU, prompt evaluation
went from 4.1 to 2.7 ms a token on one core of the 2-core test machine (docs/benchmarks.md,
"The engine built for this CPU"). Three of the source build's defaults are changed:

- ``LLAMA_BUILD_BORINGSSL=OFF``: the build would clone BoringSSL from googlesource for the
  server's HTTPS model downloads, which simpipe never uses (an offline machine cannot clone).
- ``LLAMA_LLGUIDANCE=OFF``: llguidance needs Rust and a GitHub checkout at build time; without
  it simpipe sends the answer grammar's GBNF form, which allows the same answers.
- AMX off (``-mno-amx-*``): llama.cpp's AMX matrix multiply crashed the first batched decode of
  the default Q4_K_M model here (a segfault in ``ggml_backend_amx_mul_mat``; llama.cpp issue
  20824 reports the same with other Q4_K_M models). AVX-512 and VNNI stay on.

A wheel compiled here may use every instruction this CPU has, so a worker on an older CPU
must not load it: ``engine_module`` checks first and names the fix, where llama.cpp would
die of an illegal instruction inside a round.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from simpipe.core.errors import SimpipeError
from simpipe.core.home import simpipe_home

#: The release simpipe's hand-written llama.h structs were checked against
#: (``simpipe.inference.llamacpp.hidden``): the build compiles this one, never another.
ENGINE_RELEASE = "2026.10.11549"

_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
#: The source build's options (pip passes ``CMAKE_ARGS`` to xllamacpp's build): why each, in
#: the module docstring.
CMAKE_ARGS = ("-DLLAMA_BUILD_BORINGSSL=OFF -DLLAMA_LLGUIDANCE=OFF "
              f"'-DCMAKE_C_FLAGS={_NO_AMX}' '-DCMAKE_CXX_FLAGS={_NO_AMX}'")

#: ggml's name for an instruction set (as llama.cpp's system info prints it) -> the Linux
#: /proc/cpuinfo flag a CPU needs for it. AMX is left out: the build has it off.
CPU_FLAGS = {"AVX": "avx", "AVX2": "avx2", "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2",
             "AVX_VNNI": "avx_vnni", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
             "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16"}
#: What PyPI's x86-64 wheel is compiled for.
PREBUILT_SETS = ("AVX", "AVX2", "F16C", "FMA", "BMI2")

#: Written into the installed engine's dist-info after a build here: the instruction sets it
#: was compiled for, readable without loading llama.cpp.
BUILD_RECORD = "simpipe_engine_build.json"

#: The build's log, in ``simpipe_home()`` (a failed build prints its last lines and path).
BUILD_LOG_NAME = "engine-build.log"


class EngineBuildError(SimpipeError):
    """The engine cannot be built here, or was built for another CPU."""


@dataclass(frozen=True)
class EngineBuild:
    """The installed engine: its release, whether it was built on a user's machine, and the
    instruction sets it was compiled for (``PREBUILT_SETS`` for PyPI's wheel; None when a
    build's record is unreadable)."""

    release: str
    built_here: bool
    compiled_for: tuple[str, ...] | None

    def describe(self) -> str:
        if not self.built_here:
            return f"xllamacpp {self.release}, PyPI's prebuilt wheel ({', '.join(PREBUILT_SETS)})"
        sets = ", ".join(self.compiled_for) if self.compiled_for else "unrecorded instructions"
        return f"xllamacpp {self.release}, built from source for {sets}"


def _dist_info(dist: importlib.metadata.Distribution) -> Path:
    metadata = next(f for f in dist.files or () if f.name == "METADATA")
    return Path(str(dist.locate_file(metadata))).parent


def installed_engine() -> EngineBuild:
    """What pip installed as xllamacpp, read from its metadata (llama.cpp is not loaded)."""
    try:
        dist = importlib.metadata.distribution("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        raise EngineBuildError("xllamacpp is not installed: `pip install -e .` installs the "
                               "embedded engine") from None
    record = dist.read_text(BUILD_RECORD)
    if record is None:
        return EngineBuild(dist.version, built_here=False, compiled_for=PREBUILT_SETS)
    try:
        sets = tuple(str(s) for s in json.loads(record)["compiled_for"])
    except (ValueError, KeyError, TypeError):
        sets = None  # damaged: `describe` says so; the CPU check then has nothing to refuse
    return EngineBuild(dist.version, built_here=True, compiled_for=sets)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This CPU's feature flags, None where /proc/cpuinfo is not readable (not Linux)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def unused_instruction_sets(build: EngineBuild, flags: frozenset[str] | None) -> list[str]:
    """Instruction sets this CPU has and the installed engine was not compiled for."""
    if flags is None or build.compiled_for is None:
        return []
    return [name for name, flag in CPU_FLAGS.items()
            if flag in flags and name not in build.compiled_for]


def check_cpu(build: EngineBuild, flags: frozenset[str] | None, where: str) -> None:
    """EngineBuildError for an engine built from source for instructions this CPU lacks
    (PyPI's wheel is left to llama.cpp: its sets are what any x86-64 CPU of a decade has)."""
    if not build.built_here or build.compiled_for is None or flags is None:
        return
    missing = [name for name in build.compiled_for
               if name in CPU_FLAGS and CPU_FLAGS[name] not in flags]
    if missing:
        raise EngineBuildError(
            f"{where}: the installed llama.cpp engine ({build.describe()}) needs "
            f"{', '.join(missing)}, which this CPU lacks (it would die of an illegal "
            "instruction): run `simpipe engine build` on this kind of machine, or "
            "`simpipe engine build --prebuilt` for PyPI's wheel, which needs AVX2 only")


@functools.cache
def engine_module() -> ModuleType:
    """``xllamacpp``, imported once its build is known to run on this CPU: every use of the
    embedded engine imports it through here."""
    check_cpu(installed_engine(), cpu_flags(), f"host {socket.gethostname()}")
    import xllamacpp

    return xllamacpp


def compiled_instruction_sets(system_info: str) -> tuple[str, ...]:
    """The instruction sets of ``CPU_FLAGS`` that llama.cpp's system info line
    ("CPU : SSE3 = 1 | AVX = 1 | ...") says were compiled in, in ``CPU_FLAGS``' order."""
    on = set()
    for item in system_info.replace("CPU :", "|").split("|"):
        name, _, value = item.partition("=")
        if value.strip() == "1":
            on.add(name.strip())
    return tuple(name for name in CPU_FLAGS if name in on)


def missing_build_tools() -> list[str]:
    """What a source build of the engine needs and this machine lacks, each with its fix."""
    missing = []
    if shutil.which("cmake") is None:
        missing.append("cmake (Debian/Ubuntu: `apt install cmake`, or `pip install cmake`)")
    if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        missing.append("a C++ compiler (Debian/Ubuntu: `apt install g++`)")
    include = sysconfig.get_paths().get("include")
    if not include or not Path(include, "Python.h").is_file():
        missing.append(f"Python's C headers, Python.h in {include} (Debian/Ubuntu: "
                       "`apt install python3-dev`)")
    return missing


def _pip(args: list[str], env: dict[str, str] | None, log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ pip {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([sys.executable, "-m", "pip", *args], env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise EngineBuildError(f"`pip {args[0]}` of xllamacpp=={ENGINE_RELEASE} failed (exit "
                               f"{done.returncode}); the installed engine is unchanged. Its "
                               f"last lines (all of it in {log}):\n  " + "\n  ".join(tail))


def _fresh_log() -> Path:
    log = simpipe_home() / BUILD_LOG_NAME
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    return log


def _system_info(log: Path, path: Path | None = None) -> str | None:
    """llama.cpp's system info line of the xllamacpp that a fresh process imports (this one
    may have loaded another build), from folder ``path`` first where given; None, with the
    import's error appended to ``log``, when it does not load."""
    env = None
    if path is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(path), os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-c", "import xllamacpp; "
                               "print(xllamacpp.get_system_info())"], env=env,
                              capture_output=True, text=True, check=False, timeout=120)
        failed, stderr = done.returncode != 0, done.stderr
    except subprocess.TimeoutExpired:
        failed, stderr = True, "no answer within 120 s\n"
    if failed:
        with log.open("a") as out:
            out.write(f"$ python -c 'import xllamacpp'\n{stderr}")
        return None
    return done.stdout


def check_loads(wheel: Path, log: Path) -> str:
    """llama.cpp's system info line of ``wheel``'s engine, loaded by a fresh process from a
    temporary folder before the wheel replaces the installed engine: EngineBuildError, the
    installed engine untouched, when it does not load (a compiler that emits instructions
    the CPU refuses, a library the build linked that is missing here)."""
    with tempfile.TemporaryDirectory(prefix="simpipe-engine-try-") as folder:
        _pip(["install", "--no-deps", "--no-compile", "--target", folder, str(wheel)],
             None, log)
        info = _system_info(log, Path(folder))
    if info is None:
        tail = log.read_text(errors="replace").splitlines()[-8:]
        raise EngineBuildError(f"the engine just built ({wheel.name}) does not load; the "
                               f"installed engine is unchanged. The import's last lines (all "
                               f"of it in {log}):\n  " + "\n  ".join(tail))
    return info


def build_for_this_cpu(jobs: int, say: Callable[[str], None]) -> EngineBuild:
    """Compile the pinned release for this CPU and install it over the current one. The
    wheel is built first, in a temporary folder, and loaded from another before it is
    installed: a failed build, or one that does not load, leaves the installed engine as it
    was."""
    missing = missing_build_tools()
    if missing:
        raise EngineBuildError("building the engine needs " + "; ".join(missing))
    log = _fresh_log()
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "NPROC": str(jobs)}
    env.pop("XLLAMACPP_RELEASE", None)  # set, it would turn the CPU-specific build off
    with tempfile.TemporaryDirectory(prefix="simpipe-engine-") as wheels:
        say(f"building xllamacpp {ENGINE_RELEASE} for this CPU with {jobs} jobs (log: {log})")
        # --no-cache-dir: pip's wheel cache is keyed by the source archive, not by the CPU or
        # CMAKE_ARGS, so it could hand back a wheel built otherwise.
        _pip(["wheel", "--no-deps", "--no-binary", "xllamacpp", "--no-cache-dir",
              "--wheel-dir", wheels, f"xllamacpp=={ENGINE_RELEASE}"], env, log)
        wheel = next(Path(wheels).glob("xllamacpp-*.whl"))
        say(f"loading {wheel.name} before it replaces the installed engine")
        sets = compiled_instruction_sets(check_loads(wheel, log))
        say(f"installing {wheel.name}")
        _pip(["install", "--no-deps", "--force-reinstall", str(wheel)], None, log)
    if _system_info(log) is None:  # (the same wheel loaded a moment ago)
        raise EngineBuildError(f"the engine just installed does not load (see {log}); "
                               "`simpipe engine build --prebuilt` puts PyPI's wheel back")
    _record_build(sets)
    return installed_engine()


def _record_build(sets: tuple[str, ...]) -> None:
    """Write ``BUILD_RECORD`` into the installed engine's dist-info and list it in the
    wheel's RECORD, so that the next pip uninstall or reinstall removes it with the build
    (an unlisted file would outlive it and describe PyPI's wheel as this build)."""
    info = _dist_info(importlib.metadata.distribution("xllamacpp"))
    (info / BUILD_RECORD).write_text(json.dumps({"compiled_for": list(sets)}))
    with (info / "RECORD").open("a") as record:
        record.write(f"{info.name}/{BUILD_RECORD},,\n")


def install_prebuilt(say: Callable[[str], None]) -> EngineBuild:
    """Put PyPI's prebuilt wheel of the pinned release back (runs on any AVX2 CPU)."""
    log = _fresh_log()
    say(f"installing PyPI's prebuilt xllamacpp {ENGINE_RELEASE}")
    _pip(["install", "--no-deps", "--force-reinstall", "--only-binary", "xllamacpp",
          f"xllamacpp=={ENGINE_RELEASE}"], None, log)
    return installed_engine()
