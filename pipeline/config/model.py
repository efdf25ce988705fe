"""The whole config: TOML read once, ``--set`` overrides applied, every section validated.

Each domain package owns its section (``[game]`` in ``simpipe.games``, ``[population]`` in
``simpipe.personas``, ``[cluster]`` in ``simpipe.cluster``); this module composes them and
turns validation failures into one line per problem naming the key, the bad value and
what is allowed.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import re
import reprlib
import stat
import sys
import tomllib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)

from simpipe.cluster.config import LocalClusterConfig
from simpipe.cluster.kinds import DEFAULT_KIND as CLUSTER_DEFAULT_KIND
from simpipe.cluster.kinds import KIND_ERROR, settings_union
from simpipe.config.backends import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_PERSONA_BACKEND,
    BackendPlugin,
    backend_description,
    endpoint_backends,
    llm_backends,
)
from simpipe.config.keys import joined_key, split_key
from simpipe.core.errors import SimpipeError
from simpipe.games.config import DEFAULT_KIND as GAME_DEFAULT_KIND
from simpipe.games.config import AnyGameConfig, BeautyContestConfig, GameConfig
from simpipe.games.registry import game_for
from simpipe.inference.settings import LOAD_CONTROL_KEYS, CostSettings, SamplingSettings
from simpipe.personas.config import PopulationConfig
from simpipe.personas.meta_prompt import prompt_hash

# The largest TOML integer. Every use of the seed takes it: numpy's SeedSequence (any
# integer >= 0) and the per-agent request seeds, computed in uint64 (simpipe.agents.llm).
SEED_MAX = 2**63 - 1
#: ``[cluster]``: one of the registered kinds' settings models, chosen by ``kind``
#: (``simpipe.cluster.kinds.CLUSTER_KINDS``, as registered when this module is imported).
ClusterConfig = settings_union()
# A config is a few KiB (the largest example: 2.4 KiB). The bound keeps a wrong file (a
# log, /dev/zero, a 50 MB value) from being read whole and echoed back.
MAX_CONFIG_BYTES = 2**20
# Error lines show at most this many characters of a value, a key or a message.
_SHOWN_CHARS = 200
_MESSAGE_CHARS = 300

M = TypeVar("M", bound=BaseModel)


class ConfigError(SimpipeError, ValueError):
    """A config problem; ``str(err)`` is ready to print (one line per problem)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Section):
    """What the run is called, where its results go, and the seed of everything random."""

    name: str = Field("simpipe-run", description=(
        "results go to `<output_dir>/<name>/`; letters, digits, `.`, `_`, `-`, at most 128 "
        "characters, not starting with `.` or `-`"))
    seed: StrictInt = Field(42, ge=0, le=SEED_MAX, description=(
        "seeds the population, the groups, the scripted agents and every LLM request: the same "
        "seed gives the same run"))
    output_dir: str = Field("results", description="the results root")

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        return safe_dir_name(name)


#: What a run or experiment name may be: it becomes a directory.
DIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def safe_dir_name(name: str) -> str:
    """``name`` if it can be a folder name (no separators, no "..", nothing hidden), else
    ValueError saying what is allowed."""
    if not DIR_NAME.fullmatch(name):
        raise ValueError("use letters, digits, '.', '_' or '-' (not starting with '.' or '-')")
    return name


# An experiment runs every cell on one cluster: keys that say where runs go or execute
# are the experiment's own, not a grid's.
GRID_FORBIDDEN = ("run.name", "run.output_dir", "cluster", "experiment")
MAX_CELLS = 1000  # each cell is a whole run; a grid of more is a mistake, not a study


class ExperimentSection(_Section):
    """``simpipe experiment CONFIG``: the cartesian product of `grid`, one run per cell
    under `<run.output_dir>/<experiment.name>/<cell>/`, all on one cluster. The rest of
    the file is every cell's base config; `simpipe run` refuses a file with this table."""

    name: str | None = Field(None, description=(
        "the experiment's folder under `run.output_dir` (default: `run.name`); the same rules "
        "as `run.name`"))
    grid: dict[str, list[Any]] = Field(description=(
        "config key -> the values it takes, e.g. `{ \"game.prompt\" = [\"basic\", "
        "\"cot\"], \"game.ratio\" = [\"1/2\", \"2/3\"] }`; any key but `run.name`, "
        "`run.output_dir`, `cluster.*`. Each value is set as `--set` sets it (see the top of "
        "this page): a value that is a table sets each of its keys under the grid key and "
        "keeps the others (`\"game\" = [{ ratio = \"1/2\", offset = 5 }, ...]`: keys "
        f"that vary together). At most {MAX_CELLS} cells; each cell's config is validated "
        "before any cell runs"))
    independent_draws: bool = Field(False, description=(
        "`false`: every cell has the base `run.seed`, so an agent's random draws are the "
        "same in every cell and the report compares cells as paired samples (by `agent_id`: "
        "Wilcoxon signed-rank, paired t); `true`: each cell's `run.seed` is derived from the "
        "base seed and its grid values, so cells are independent samples (Mann-Whitney, "
        "Welch)"))

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str | None) -> str | None:
        return None if name is None else safe_dir_name(name)

    @field_validator("grid", mode="before")
    @classmethod
    def _flat_grid(cls, grid: Any) -> Any:
        # `[experiment.grid]` with `game.prompt = [...]` reads as nested tables: the same grid.
        if not isinstance(grid, dict):
            return grid
        flat: dict[str, Any] = {}

        def walk(prefix: str, node: dict) -> None:
            for key, value in node.items():
                name = f"{prefix}.{key}" if prefix else str(key)
                if isinstance(value, dict):
                    walk(name, value)
                else:
                    flat[name] = value

        walk("", grid)
        return flat

    @field_validator("grid")
    @classmethod
    def _usable_grid(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not grid:
            raise ValueError("no keys: give at least one key and its values")
        cells = 1
        for key, values in grid.items():
            if any(not part.strip() for part in split_key(key)):
                raise ValueError(f"{shown(key)}: not a config key (expected e.g. game.prompt)")
            if any(key == f or key.startswith(f + ".") for f in GRID_FORBIDDEN):
                raise ValueError(f"{shown(key)}: not a grid key: every cell runs on one "
                                 "cluster and is named by the grid (run.name, run.output_dir, "
                                 "cluster.* and experiment.* are the experiment's own)")
            if not values:
                raise ValueError(f"{shown(key)}: no values; give at least one")
            texts = [json.dumps(v, sort_keys=True, default=str) for v in values]
            if len(set(texts)) < len(texts):
                raise ValueError(f"{shown(key)}: a value is listed twice")
            for value in values:
                if isinstance(value, datetime.datetime | datetime.date | datetime.time):
                    raise ValueError(f"{shown(key)} = {shown(value)}: no config key takes a "
                                     "date or time; quote it to make it text")
            cells *= len(values)
        if cells > MAX_CELLS:
            raise ValueError(f"{cells:,} cells; at most {MAX_CELLS:,} (each cell is a run)")
        parts = {key: split_key(key) for key in grid}
        for key, values in grid.items():
            n = len(parts[key])
            for inner in (k for k in grid if len(parts[k]) > n and parts[k][:n] == parts[key]):
                # "game" = [{ ratio = ... }] beside "game.prompt": fine unless a table of
                # "game" sets prompt too, or a value of "game" replaces the whole table.
                first = parts[inner][n]
                if any(not isinstance(v, dict) or first in v for v in values):
                    raise ValueError(f"{shown(key)} and {shown(inner)} overlap (both set "
                                     f"{shown(inner)}): give it in one place")
        return grid


class _Agents(SamplingSettings):
    """``[agents]`` without the back-ends' tables (``AgentsConfig`` adds one per back-end)."""

    backend: Literal[tuple(BACKENDS)] = Field(  # type: ignore[valid-type]
        DEFAULT_BACKEND, description=backend_description())
    share_answers: Literal["auto", "off"] = Field("auto", description=(
        "`auto`: agents whose prompts are identical draw their answers from one answer "
        "distribution computed for that prompt, where the back-end and the answer format allow "
        "it ([shared answers](shared-answers.md)); `off`: one model call per agent"))
    share_max_unseen: FiniteFloat = Field(1e-4, gt=0, le=0.01, description=(
        "the most probability mass a shared distribution may leave unseen (tokens beyond the "
        "top n the engine returns); a prompt above it gets one call per agent instead"))
    share_min_agents: StrictInt = Field(2, ge=1, description=(
        "for back-ends that give answer distributions but cannot walk them lazily, in rounds "
        "that are not planned (a mixed population's groups): a prompt is shared when at "
        "least this many agents of the partition have it, the others get one call each. "
        "Planned rounds choose per prompt by cost (`[agents.cost]`), and the embedded "
        "`llamacpp` back-end by its measured costs ([shared answers](shared-answers.md))"))
    cost: CostSettings = Field(CostSettings(), description=(
        "what requests cost the servers: how the round plan chooses, per distinct prompt, "
        "between an answer tree, `n` samples per request and one request per agent"))
    reproducible: StrictBool = Field(False, description=(
        "one call per agent, made one at a time from a clean slot (embedded llama.cpp): the "
        "same seed gives the same answers with any `n_parallel`, at the cost of batching. "
        "Shared answers are reproducible without it, except through a llama.cpp server, "
        "whose answer trees then run side by side on its slots (with it: one at a time, "
        "each on slot 0)"))
    max_raw_chars: StrictInt = Field(4096, ge=0, le=2**20, description=(
        "characters of each answer stored in the `raw` column; the number is parsed from the "
        "whole answer, and a longer one is stored as its prefix with `raw_truncated = true`"))
    by: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict, description=(
        "a mixed population: `[agents.by.<attribute>.<value>]` tables, one per value of a "
        "categorical population attribute, each overriding `[agents]` for the agents with "
        "that value (`backend`, its table, `temperature`, ...); e.g. `[agents.by.model."
        "scripted] backend = \"scripted\"` beside `[agents.by.model.gemma] backend = "
        "\"llamacpp\"`. One attribute; every value mapped. A back-end table in an override "
        "is merged key by key into `[agents]`'s ([mixed populations](runs.md#mixed-"
        "populations)); empty: one back-end for all"))

    @model_validator(mode="after")
    def _mix_shape(self) -> _Agents:
        from simpipe.config.population_mix import check_shape  # it reads this module's AgentsConfig

        check_shape(self)  # type: ignore[arg-type]
        return self

    @property
    def plugin(self) -> BackendPlugin:
        """The chosen back-end's entry in ``simpipe.config.backends.BACKENDS``."""
        return BACKENDS[self.backend]

    @property
    def settings(self) -> BaseModel:
        """The chosen back-end's table, ``[agents.<backend>]``."""
        return getattr(self, self.backend)

    def identity(self) -> dict[str, Any]:
        """What decides which model answers (the persona generator's part of the population
        cache key); endpoints and concurrency are left out where a model name says it all."""
        return {"backend": self.backend, **self.plugin.identity(self.settings)}


#: ``[agents]``: sampling, answer sharing, the back-end's name, and one table per back-end
#: of ``simpipe.config.backends.BACKENDS`` (``agents.scripted``, ``agents.llamacpp``, ...).
AgentsConfig = create_model(
    "AgentsConfig", __base__=_Agents, __module__=__name__,
    **{name: (plugin.settings, plugin.settings()) for name, plugin in BACKENDS.items()},
)


def _mix_fits_population(agents: Any, info: ValidationInfo) -> Any:
    """``agents.by`` names a categorical attribute of ``[population]`` and maps each value."""
    from simpipe.config.population_mix import check_population  # see _Agents._mix_shape

    population = info.data.get("population")
    if population is not None:
        check_population(agents, population)
    return agents


def _answers_fit_max_tokens(agents: Any, info: ValidationInfo) -> Any:
    """Every LLM group's ``max_tokens`` holds the game's longest basic answer (chain of
    thought has its own budget, ``cot_max_tokens``, and flags a cut answer)."""
    from simpipe.config.population_mix import check_answer_room  # see _Agents._mix_shape

    game = info.data.get("game")
    if game is not None and not game.free_text_answer:
        check_answer_room(agents, game_for(game).answer().language().longest())
    return agents


def _game_fits_population(game: AnyGameConfig, info: ValidationInfo) -> AnyGameConfig:
    """The game's own rule on the population (public goods: whole groups only)."""
    population = info.data.get("population")
    problem = population is not None and game_for(game).population_problem(population.size)
    if problem:
        raise ValueError(problem)
    return game


class Config(_Section):
    """A config file is TOML with these sections. Every section may be left out, and so may
    every key that is not marked "required". ``--set key=value`` overrides any key on the
    command line (values are TOML; bare words are strings):
    ``simpipe run cfg.toml --set game.rounds=5``; a whole section is a TOML inline table:
    ``--set 'cluster={kind="local"}'``. A key that is not listed here, or a value
    outside what is allowed, makes ``simpipe validate`` and ``simpipe run`` exit with
    status 2 and one line per problem naming the key, the value and what is allowed;
    integers are strict (``true`` is not 1) and numbers finite.

    **Setting a key**, with ``--set`` or as an [experiment grid](#experiment)'s key, follows one
    rule. A part whose name holds a dot is quoted as in TOML: ``--set
    'agents.by.model."gemma-t0.3".temperature=0.5'``. Every part of the key before the last must
    be a section: where the config has a value there (``game = 3`` with ``--set
    game.rounds=5``), it is an error naming the key, not a silent replacement. A table value is
    merged key by key into the section already there, tables within it too: ``--set
    'game={ratio="1/2"}'`` changes the ratio and keeps the file's rounds. A table replaces
    instead where its keys are the user's own names (``population.attributes``, an attribute's
    ``values``, ``agents.by``: a dotted key adds one, ``--set
    population.attributes.education.values.PhD=1``), and in ``[cluster]`` and ``[game]``, whose
    keys depend on their ``kind``, where it names another kind (the old kind's keys would not
    belong to the new one); so too where it gives a section another shape (an attribute's
    ``values`` for ``min`` and ``max``). Any other value replaces what was there.
    """

    run: RunSection = RunSection()
    population: PopulationConfig = PopulationConfig()
    # One of the games' tables, chosen by game.kind (simpipe.games.config).
    game: Annotated[GameConfig, AfterValidator(_game_fits_population)] = Field(
        default_factory=BeautyContestConfig, description=(
            "the game and its rules. `kind` chooses ([games](games.md)), and each game has "
            "its own keys: a key of the other game's table is an error naming the game it "
            "belongs to"))
    agents: Annotated[AgentsConfig, AfterValidator(_mix_fits_population),
                      AfterValidator(_answers_fit_max_tokens)] = AgentsConfig()
    cluster: ClusterConfig = Field(LocalClusterConfig(), description=(
        "where the Dask workers run. `kind` chooses, and each kind has its own keys: a key of "
        "another kind (`queue` with `kind = \"local\"`) is an error naming the key and the "
        "kind. To change the kind with `--set`, replace the section: "
        "`--set 'cluster={kind=\"local\"}'`"))
    experiment: ExperimentSection | None = Field(None, description=(
        "a grid of runs (`simpipe experiment CONFIG`, [runs](runs.md#experiments)); "
        "absent: the file is one run"))

    @model_serializer(mode="wrap")
    def _without_experiment(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A cell's run.json and results hash are those of a plain run: no table when absent.
        data = handler(self)
        if self.experiment is None:
            data.pop("experiment", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _slurm_job_logs_in_the_run(cls, raw: Any) -> Any:
        # sbatch writes a job's output to the directory it was submitted from unless told
        # otherwise, which left slurm-<id>.out files wherever simpipe was started.
        if not isinstance(raw, dict):
            return raw
        cluster = raw.get("cluster")
        if isinstance(cluster, BaseModel):
            cluster = cluster.model_dump()
        run = raw.get("run", {})
        if isinstance(run, BaseModel):
            run = run.model_dump()
        if (not isinstance(cluster, dict) or cluster.get("kind") != "slurm"
                or cluster.get("log_directory") is not None or not isinstance(run, dict)):
            return raw
        fields = RunSection.model_fields
        output_dir = run.get("output_dir", fields["output_dir"].default)
        name = run.get("name", fields["name"].default)
        if not isinstance(output_dir, str) or not isinstance(name, str):
            return raw  # the run section's own validation says what is wrong
        return {**raw, "cluster": {**cluster,
                                   "log_directory": str(run_job_log_dir(output_dir, name))}}

    @model_validator(mode="after")
    def _backends_fit_population(self) -> Config:
        # Every back-end's table, chosen or not: a table that cannot fit is an error either way.
        for name, plugin in BACKENDS.items():
            if plugin.population_check is not None:
                plugin.population_check(getattr(self.agents, name), self.population)
        return self

    @model_validator(mode="after")
    def _persona_agents(self) -> Config:
        if self.population.persona.mode == "llm":
            persona_agents_config(self.population.persona.agents)
        return self

    @property
    def persona_agents(self) -> AgentsConfig:
        """The back-end that writes LLM personas (``population.persona.agents``)."""
        return persona_agents_config(self.population.persona.agents)

    def results_hash(self) -> str:
        """Hash of everything that decides the results (not where or on what they run, nor
        how hard the servers are pressed: ``LOAD_CONTROL_KEYS``)."""
        return self._results_digest(("endpoints", *LOAD_CONTROL_KEYS))

    def holds_run_of(self, stored_hash: str) -> bool:
        """Whether a run whose run.json records ``stored_hash`` is a run of this config: its
        results hash, or the hash such a run got before the load-control keys left it (they
        counted then, as written)."""
        # The earlier digest only when the current one differs: experiments ask per cell.
        return (stored_hash == self.results_hash()
                or stored_hash == self._results_digest(("endpoints",)))

    def _results_digest(self, server_keys: tuple[str, ...]) -> str:
        """``results_hash`` without the servers' ``server_keys``."""
        data = self.model_dump(mode="json", exclude={
            "cluster": True, "run": {"output_dir"}, "experiment": True,
            # Servers may move between a run and its --resume (a new `cluster up`).
            "agents": dict.fromkeys(endpoint_backends(), set(server_keys)),
        })
        from simpipe.config.population_mix import hash_view  # see _Agents._mix_shape

        hash_view(data["agents"], endpoint_backends(), server_keys)
        if data["agents"].get("cost") == CostSettings().model_dump(mode="json"):
            # Costs choose how prompts are answered (so they count where set), but a config
            # that sets none hashes as it did before they existed.
            del data["agents"]["cost"]
        return _digest(data)

    def resume_hint(self, stored_hash: str) -> str:
        """Why a run folder with ``stored_hash`` does not match this config, where a known
        change of defaults explains it; "" otherwise."""
        game = self.game
        if getattr(game, "history_layout", None) == "split":
            earlier = self.model_copy(update={
                "game": game.model_copy(update={"history_layout": "by_round"})})
            if earlier.holds_run_of(stored_hash):
                return ("; it was made with the earlier prompt layout: set "
                        'game.history_layout = "by_round" to resume it as it began')
        return ""

    def population_hash(self) -> str:
        """Hash of what decides the population: its spec and the seed, and for LLM personas
        the generator model and the meta-prompt wording."""
        # The generator enters as its model identity, not its endpoints or slot counts.
        spec = self.population.model_dump(mode="json", exclude={"persona": {"agents"}})
        data: dict[str, Any] = {"seed": self.run.seed, "population": spec}
        if self.population.persona.mode == "llm":
            data["persona_generator"] = self.persona_agents.identity()
            data["persona_prompt"] = prompt_hash()
        return _digest(data)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    def with_sections(self, source: str = "config", **sections: BaseModel) -> Config:
        """This config with whole sections replaced (``cluster=AddressClusterConfig(...)``),
        validated as a config file is; a ConfigError naming ``source`` and the key."""
        return _validated_copy(self, source, sections)

    def with_endpoints(self, backend: str, urls: list[str], source: str = "servers") -> Config:
        """This config with ``agents.<backend>.endpoints = urls`` (servers started for a run),
        validated like the rest; a ConfigError naming ``source`` and the key."""
        table = getattr(self.agents, backend)
        try:
            table = _validated_copy(table, source, {"endpoints": list(urls)})
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(f"{source}: ", f"{source}: agents.{backend}.", 1)
                              ) from None
        agents = _validated_copy(self.agents, source, {backend: table})
        return self.with_sections(source, agents=agents)


def run_job_log_dir(output_dir: str | Path, name: str) -> Path:
    """Where the SLURM jobs a run starts write their output, unless cluster.log_directory
    says otherwise: ``<run>/logs/slurm``, absolute (jobs may start in another directory)."""
    return (Path(output_dir) / name / "logs" / "slurm").absolute()


_PERSONA_AGENT_KEYS = ("backend", *llm_backends())


def persona_agents_config(raw: dict[str, Any]) -> AgentsConfig:
    """``population.persona.agents`` as an AgentsConfig (default: embedded llama.cpp).

    Only the back-end part of ``[agents]`` belongs here: sampling for personas is set in
    ``population.persona`` itself. Raises ValueError naming the key."""
    key = "population.persona.agents"
    unknown = sorted(set(raw) - set(_PERSONA_AGENT_KEYS))
    if unknown:
        raise ValueError(f"unknown key {key}.{_cut(unknown[0], _SHOWN_CHARS)}; allowed here: "
                         f"{', '.join(_PERSONA_AGENT_KEYS)} (sampling: population.persona."
                         "temperature, top_p, max_tokens)")
    try:
        agents = AgentsConfig.model_validate({"backend": DEFAULT_PERSONA_BACKEND, **raw})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _cut(".".join([key, *map(str, err["loc"])]), _SHOWN_CHARS)
        raise ValueError(f"{where}: {_cut(err['msg'], _MESSAGE_CHARS)}") from None
    if not agents.plugin.is_llm:
        raise ValueError(f"{key}.backend = {agents.backend!r}: personas need an LLM; "
                         f"allowed: {', '.join(llm_backends())}")
    return agents


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- reading --------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML config, apply ``key=value`` overrides, validate. Raises ConfigError."""
    return config_from_dict(read_config_dict(path, overrides), source=str(path))


def read_config_dict(path: str | Path,
                     overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """A TOML config file as a dict with ``key=value`` overrides applied, not validated (an
    experiment validates one config per cell from it). Raises ConfigError."""
    path = Path(path)
    data = _read_config_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                          "TOML files are UTF-8: save it as UTF-8") from None
    _check_dotted_depth(text, str(path))
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {_cut(str(exc), _MESSAGE_CHARS)}") from None
    except (RecursionError, ValueError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {_unreadable(exc)}") from None
    for item in overrides:
        apply_override(raw, item)
    return raw


def _validated_copy(model: M, source: str, update: dict[str, Any]) -> M:
    """``model.model_copy(update=...)``, validated: model_copy alone checks nothing, so the
    copy goes through the model's validators again (sections that are already models are
    taken as they are: they were validated when they were made)."""
    copy = model.model_copy(update=update)
    try:
        return type(model).model_validate(dict(copy))
    except ValidationError as exc:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: "
                 f"{err['msg'].removeprefix('Value error, ')}"
                 for err in exc.errors(include_url=False)]
        raise ConfigError("\n".join(f"{source}: {line}" for line in lines)) from None


def _read_config_file(path: Path) -> bytes:
    """The file's bytes: a regular file of at most MAX_CONFIG_BYTES, else ConfigError."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    # Checked on the open file, so what is read is what was checked.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file; pass a TOML config file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: a config file of more than {MAX_CONFIG_BYTES // 2**20} MiB; "
                          "simpipe configs are a few KiB: is this the right file?")
    return data


# tomllib's time grows with the square of a dotted key's length (`a.a.a...= 1`: 8,000 parts
# take a second, the 500,000 a 1 MiB file holds would take hours). simpipe's keys have at
# most 6 parts; the pattern also counts quoted parts.
MAX_DOTTED_PARTS = 64
# The lookbehind starts a match only where a key can start (not inside a key, not right
# after a dot): without it a 1 MiB line of letters is scanned from each of its positions.
# Worst case measured: 1.2 s for 1 MiB of 63-part keys with spaces around the dots.
_DOTTED_RUN = re.compile(
    r"""(?<![A-Za-z0-9_.-])(?>(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')[ \t]*\.[ \t]*)"""
    rf"{{{MAX_DOTTED_PARTS},}}")


def _check_dotted_depth(text: str, where: str) -> None:
    """ConfigError when the text holds a dotted key of more than MAX_DOTTED_PARTS parts
    (checked before tomllib reads it)."""
    found = _DOTTED_RUN.search(text)
    if found:
        line = text.count("\n", 0, found.start()) + 1
        raise ConfigError(f"{where}, line {line}: a dotted key of more than {MAX_DOTTED_PARTS} "
                          "parts; simpipe's keys have at most 6")


def _unreadable(exc: RecursionError | ValueError) -> str:
    """What tomllib could not read besides syntax: tables or arrays nested deeper than
    Python's recursion allows, and integers longer than int() converts."""
    if isinstance(exc, RecursionError):
        return "tables or arrays nested too deeply"
    return f"an integer with more than {sys.get_int_max_str_digits()} digits"


def config_from_dict(raw: dict, source: str = "config") -> Config:
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        lines = _error_lines(exc, raw)
        raise ConfigError("\n".join(f"{source}: {line}" for line in lines)) from None


# The sections whose keys depend on their ``kind`` (one table per kind), with the kind they
# have where the config names none: ``set_key`` replaces such a section when a table set
# into it names another kind.
KIND_SECTIONS: dict[str, str] = {"cluster": CLUSTER_DEFAULT_KIND, "game": GAME_DEFAULT_KIND}


def apply_override(raw: dict, item: str) -> None:
    """``game.rounds=5`` into the nested dict; values are TOML (bare words are strings)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in split_key(key)):
        raise ConfigError(f"--set {shown(item)}: expected key=value, e.g. --set game.rounds=5")
    _check_dotted_depth(text, f"--set {shown(item)}")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    except (RecursionError, ValueError) as exc:
        raise ConfigError(f"--set {shown(item)}: not a TOML value: {_unreadable(exc)}") from None
    set_key(raw, key, value, where=f"--set {shown(item)}")


def set_key(raw: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Set the dotted ``key`` (``game.rounds``) of a config read into a dict to ``value``:
    the one rule of ``--set`` and of experiment grids (``simpipe.run.experiment``), so that
    a key means the same in both (the top of docs/config.md says it to users).

    - Every part before the last is a section, made where the config has none. A value
      there (``game = 3`` and ``game.rounds``) is refused: ConfigError starting with
      ``where``, naming the key and the fix. Replacing the value by a section would drop
      what the file says without a word.
    - A table value is merged key by key into a section already there (``is_section``),
      tables within it too: the keys it does not name keep their values from the file
      (``game = { ratio = "1/2" }`` changes the ratio, not the rounds). Three exceptions, where
      merging would leave no way to say what a user means:
      * a table of the user's own keys (an attribute's ``values``, ``agents.by``) is
        replaced: merged, no key could ever be dropped from it, while a dotted key still
        adds one (``...values.c = 1``);
      * in ``[cluster]`` and ``[game]`` (``KIND_SECTIONS``), a table that names a ``kind``
        other than the section's replaces it: their keys depend on the kind, so the old
        kind's keys would be unknown keys of the new one, and ``--set
        'cluster={kind="local"}'`` (what the unknown-key error tells a user to write)
        could never change the kind;
      * likewise in a section of several shapes (an attribute: ``values``, or ``min`` and
        ``max``), a table that no one shape holds together with the section's keys.
    - Any other value replaces what was there.

    ``value`` is copied: the config never shares a table with the caller (a grid's values
    are set into one config per cell)."""
    parts = split_key(key)
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            section = joined_key(*parts[:depth + 1])
            rest = joined_key(*parts[depth + 1:])
            raise ConfigError(
                f"{where}: {shown(section)} is a value ({shown(child)}), not a section, so "
                f"{shown(key)} cannot be set in it; make {section} a table in the config "
                f"([{section}], or {section} = {{ {rest} = ... }})")
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        _merge_table(node[last], value, key)
    else:
        node[last] = copy.deepcopy(value)


def _merge_table(section: dict[str, Any], table: dict[str, Any], path: str) -> None:
    """``table`` set at the config's ``path``, where ``section`` is (``set_key``'s rule)."""
    default = KIND_SECTIONS.get(path)
    models = _models_at(path)
    other_kind = default is not None and table.get("kind", default) != section.get("kind",
                                                                                  default)
    # A section of several shapes (an attribute: values, or min and max, or a condition)
    # takes the table's shape when no one shape holds both its keys and the table's.
    one_shape = any(set(section) | set(table) <= set(m.model_fields) for m in models)
    if not models or other_kind or not one_shape:
        section.clear()
        section.update(copy.deepcopy(table))
        return
    for key, value in table.items():
        if isinstance(value, dict) and isinstance(section.get(key), dict):
            _merge_table(section[key], value, f"{path}.{key}")
        else:
            section[key] = copy.deepcopy(value)


def is_section(key: str) -> bool:
    """Whether the config's dotted ``key`` holds a section, a table of keys the config
    defines (``game``, ``agents.llamacpp``, ``population.attributes.education``), rather
    than a table of the user's own keys (``population.attributes``, an attribute's
    ``values``, ``agents.by``) or a plain value. Unknown keys are not sections."""
    return bool(_models_at(key))


def _models_at(key: str) -> list[type[BaseModel]]:
    """The section models the config's dotted ``key`` may hold (several where it is a
    union: ``[cluster]``'s kinds, an attribute's shapes); none where it is not a section."""
    annotations: list[Any] = [Config]
    for part in split_key(key):
        inside: list[Any] = []
        for annotation in annotations:
            for member in _members(annotation):
                if _is_model(member) and part in member.model_fields:
                    inside.append(member.model_fields[part].annotation)
                elif get_origin(member) is dict:
                    inside.append(get_args(member)[1])  # any name: the map's value type
        if not inside:
            return []
        annotations = inside
    return [member for a in annotations for member in _members(a) if _is_model(member)]


def _members(annotation: Any) -> list[Any]:
    """The types an annotation allows: ``Annotated`` unwrapped, unions split."""
    if get_origin(annotation) is Annotated:
        return _members(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = _SHOWN_CHARS
_SHORT_REPR.maxlevel = 3


def shown(value: Any) -> str:
    """A value for an error line: its repr, cut to a short prefix that says how long the
    whole was (a 50 MB ``run.name`` is not echoed back); TOML dates and times as written."""
    if isinstance(value, str) and len(value) > _SHOWN_CHARS:
        return f"{value[:_SHOWN_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return f"{value.isoformat()} (a TOML {_toml_kind(value)})"
    return _SHORT_REPR.repr(value)


def _toml_kind(value: datetime.datetime | datetime.date | datetime.time) -> str:
    if isinstance(value, datetime.datetime):
        return "date-time"
    return "date" if isinstance(value, datetime.date) else "time"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _error_lines(exc: ValidationError, raw: dict) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        keys, kinds, _ = _walk(err["loc"])
        full_key = ".".join(keys) or "(top level)"
        key = _cut(full_key, _SHOWN_CHARS)
        # Validators may quote the value: the message is cut too.
        msg = _cut(err["msg"].removeprefix("Value error, "), _MESSAGE_CHARS)
        if full_key == "agents" and msg.startswith("agents."):
            lines.append(msg)  # the mix's checks name the whole key (simpipe.config.population_mix)
            continue
        if err["type"] == "extra_forbidden":
            section = _walk(err["loc"][:-1])[2]
            names = list(section.model_fields) if section else []
            allowed = ", ".join(sorted(names, key=lambda n: n != "kind")) or "see docs/config.md"
            # Name the kind where it decided which keys belong (a key of another kind).
            section_key = ".".join(keys[:-1])
            chosen = [(where, kind) for where, kind in kinds if where == section_key]
            if chosen:
                where, kind = chosen[0]
                lines.append(f"unknown key {shown(full_key)} for {where}.kind = {kind!r}; "
                             f"allowed here: "
                             f"{allowed} (to change the kind with --set, replace the section: "
                             f"--set '{where}={{kind=\"{kind}\", ...}}')")
            else:
                lines.append(f"unknown key {shown(full_key)}; allowed here: {allowed}")
        elif err["type"] == KIND_ERROR:
            lines.append(f"{key}.kind = {shown(err['input'].get('kind'))}: {msg}")
        elif err["type"] == "missing":
            lines.append(f"{key}: missing; {msg.lower()}")
        elif "input" in err and not isinstance(err["input"], dict):
            value = err["input"]
            if isinstance(value, datetime.datetime | datetime.date | datetime.time):
                # An unquoted 00:30:00 or 2024-01-01 is a TOML time or date, not text.
                msg += f"; quote it to make it text: \"{value.isoformat()}\""
            lines.append(f"{key} = {shown(value)}: {msg}")
        else:
            lines.append(f"{key}: {msg}")
    return lines


# Pydantic names the members of an untagged union in an error's location; they mean
# nothing to a user.
_MEMBER_NAMES = ("CategoricalAttribute", "IntegerAttribute", "ConditionalAttribute")


def _walk(loc: tuple) -> tuple[list[str], list[tuple[str, str]], type[BaseModel] | None]:
    """An error location as the user's key path, the ``(section, kind)`` of each tagged
    union (``[cluster]``) on the way (pydantic puts the chosen kind in the location), and
    the section model it ends in (None inside a dict or a list)."""
    keys: list[str] = []
    kinds: list[tuple[str, str]] = []
    model: type[BaseModel] | None = Config
    parts = [str(p) for p in loc]
    i = 0
    while i < len(parts):
        part = parts[i]
        i += 1
        if part.startswith(("function-", "tagged-union")) or part in _MEMBER_NAMES:
            continue
        keys.append(part)
        field = model.model_fields.get(part) if model is not None else None
        members = _tagged_members(field.annotation) if field is not None else {}
        if members and i < len(parts) and parts[i] in members:
            kinds.append((".".join(keys), parts[i]))
            model = members[parts[i]]
            i += 1
        elif field is not None and isinstance(field.annotation, type) \
                and issubclass(field.annotation, BaseModel) and not members:
            model = field.annotation
        else:
            model = None
    return keys, kinds, model


def _tagged_members(annotation: Any) -> dict[str, type[BaseModel]]:
    """``{tag: model}`` of a union of ``Annotated[model, Tag(tag)]`` (``[cluster]``)."""
    members = {}
    for member in get_args(annotation):
        if get_origin(member) is Annotated:
            model, *meta = get_args(member)
            members.update({m.tag: model for m in meta if isinstance(m, Tag)})
    return members
