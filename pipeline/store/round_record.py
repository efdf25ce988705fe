"""One finished round's record in ``run.json``, as a typed model with no room for stray keys.

The run builds a ``RoundRecord`` (``simpipe.run.simulation``) and the ledger writes it; every
reader gets the same model back (``simpipe.store.record.RunRecord.rounds``). Unknown keys are
refused both ways: a misspelled field is a ``ValidationError`` where the record is built, and
a ``run.json`` whose round holds a key simpipe never writes is a ``CorruptFile`` naming the
file and the key. What differs per game has a typed place of its own: the game's headline
numbers besides the mean (``Game.round_numbers``) in ``game_numbers``, and a mixed
population's split by attribute value in ``by``.

Files of layout 2 and earlier (``simpipe.store.layout``) kept the game's numbers beside the
fields (``"mean_payoff": 12.0`` directly in the round); ``lift_flat_game_numbers`` moves
those keys, and only those, into ``game_numbers`` before such a file is validated.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from simpipe.core.records import NonNegative, StrictRecord


class _ClosedRecord(StrictRecord):
    """Frozen (a record read back is a fact about the files; only the writer replaces it)
    and closed: a key that is not a field is an error, never data."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ValueSplit(_ClosedRecord):
    """A mixed population's agents of one value of the mix attribute, in one round."""

    backend: str
    n: NonNegative = 0
    n_valid: NonNegative = 0
    mean: float | None = None  # of their valid answers
    tokens_in: NonNegative = 0
    tokens_out: NonNegative = 0


class MixSplit(_ClosedRecord):
    """A round of a mixed population (``[agents.by]``), per value of its attribute in the
    config's order (``simpipe.agents.mix.round_split``)."""

    attribute: str
    values: dict[str, ValueSplit] = {}


#: The game numbers runs wrote beside the round's fields before layout 3 (the public goods
#: game's; the beauty contest had none besides ``mean``). Only these move: any other unknown
#: key of an old file is still an error.
FLAT_GAME_NUMBERS = ("contribution_pct", "mean_payoff")


class RoundRecord(_ClosedRecord):
    """One finished round's headline numbers, counts, costs and timings."""

    complete: bool = False
    started_at: float | None = None  # Unix time, the clock emulated servers' stats use
    n: NonNegative = 0
    n_valid: NonNegative = 0
    n_unparsed: NonNegative = 0
    n_out_of_range: NonNegative = 0
    n_error: NonNegative = 0
    n_truncated: NonNegative = 0  # cut at the token limit (0 in files before the status)
    n_no_final_answer: NonNegative = 0  # a chain of thought without its marked answer
    mean: float | None = None  # the mean answer: every game has one
    # The game's other headline numbers (``Game.round_numbers`` without ``mean``), e.g. the
    # public goods game's ``contribution_pct`` and ``mean_payoff``; None where a round has no
    # valid answer to compute one from.
    game_numbers: dict[str, float | None] = {}
    tokens_in: NonNegative = 0
    tokens_out: NonNegative = 0
    elapsed_s: float | None = None
    agents_per_s: float | None = None
    partitions_reused: NonNegative = 0
    distinct_prompts: NonNegative = 0
    sharing_factor: float | None = None
    model_calls: NonNegative = 0
    shared_agents: NonNegative = 0
    fallback_prompts: NonNegative = 0
    unseen_mass_max: float = 0.0
    prompt_tokens_evaluated: NonNegative = 0  # a cached common prefix is not evaluated again
    prompt_tokens_per_distinct_prompt: float | None = None
    planned_prompts: NonNegative = 0  # prompts the round plan answered: trees and walks
    plan_s: float | None = None  # the plan's wall time (its stages 1 and 2)
    # How the plan answered the round's distinct prompts: per method its prompts and agents,
    # and where priced the predicted and (emulated fleets) spent GPU seconds
    # (``simpipe.answers.planner.methods_record``)
    answer_methods: dict[str, Any] | None = None
    by: MixSplit | None = None  # a mixed population's split; None without a mix

    @property
    def n_invalid(self) -> int:
        return self.n - self.n_valid

    @property
    def numbers(self) -> dict[str, float | None]:
        """The game's headline numbers as ``Game.round_numbers`` gives them: ``mean`` and
        the game's own."""
        return {"mean": self.mean, **self.game_numbers}

    def value(self, name: str) -> Any:
        """A field or one of the game's numbers by name (None if the round has none)."""
        if name in type(self).model_fields:
            return getattr(self, name)
        return self.game_numbers.get(name)


def lift_flat_game_numbers(rounds: Any) -> Any:
    """``run.json``'s ``rounds`` of a file before layout 3, with the game numbers written
    beside each round's fields (``FLAT_GAME_NUMBERS``) moved into its ``game_numbers``.
    Anything not shaped as simpipe wrote it is returned as it is, for validation to name."""
    if not isinstance(rounds, dict):
        return rounds
    lifted = {}
    for key, record in rounds.items():
        if isinstance(record, dict) and any(name in record for name in FLAT_GAME_NUMBERS):
            record = dict(record)
            nested = record.get("game_numbers", {})
            flat = {name: record.pop(name) for name in FLAT_GAME_NUMBERS if name in record}
            record["game_numbers"] = {**flat, **nested} if isinstance(nested, dict) else nested
        lifted[key] = record
    return lifted
