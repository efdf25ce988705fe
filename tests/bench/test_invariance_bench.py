"""``simpipe bench invariance``: its comparisons, its prompts, and the one fact the
reproducible path rests on (a lone sequence decoded afresh in slot 0 gives bit-identical
log-probabilities again). No timing assertions."""

from __future__ import annotations

import pytest

from simpipe.bench.invariance import Setup, compare, invariance_rows, round3_prompts


def test_compare_counts_bit_identical_answers_and_the_largest_difference():
    ref = ((5, -0.5), (7, -1.25))
    assert compare([ref, ref], [ref, ref]) == (2, 0.0)
    moved = ((5, -0.5), (7, -1.25 + 2**-20))
    same, worst = compare([ref, ref], [ref, moved])
    assert same == 1 and worst == 2**-20
    # A token in only one of the two lists makes them differ but has no difference to take.
    assert compare([ref], [((5, -0.5), (9, -1.25))]) == (0, 0.0)


def test_round3_prompts_are_distinct_sorted_and_share_the_rules():
    prompts = round3_prompts(12)
    assert len(set(prompts)) == 12 and prompts == sorted(prompts)
    assert all("Round 3 of" in p for p in prompts)
    head = prompts[0][:200]
    assert all(p.startswith(head) for p in prompts)


@pytest.mark.llm
@pytest.mark.slow
def test_a_lone_fresh_sequence_in_slot_0_is_bit_identical_again():
    rows, refs = invariance_rows(Setup(threads=2, n_parallel=2), round3_prompts(2)[:1],
                                 widths=(2,), default_refs=None)
    by_condition = {(r["condition"], r["against"]): r for r in rows}
    assert by_condition[("lone, slot 0, fresh, again", "lone ref")]["identical"] == "1/1"
    assert len(refs) == 1 and len(refs[0]) == 20
    # Every condition of the table has a row, each batch also against its own repeat.
    assert ("batch of 2, distinct prompts, fresh", "same batch, run 1") in by_condition
    assert ("lone, slot 1, fresh", "lone ref") in by_condition
