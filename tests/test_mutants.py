"""Mutation testing as a standing check (``nanokpu mutate``): every non-equivalent mutant of
:data:`nanokpu.commands.mutate.MUTANTS` is killed by its killer tests, so a weakened test fails
here; every mutant's text occurs exactly once where it says."""

import pytest

from nanokpu.commands import mutate

LIVE = [m for m in mutate.MUTANTS if not m.equivalent]


def test_every_mutant_applies_and_ids_are_unique():
    assert len({m.id for m in mutate.MUTANTS}) == len(mutate.MUTANTS)
    for m in mutate.MUTANTS:
        assert mutate.mutated(m) != (mutate.ROOT / m.file).read_text(), m.id
        assert not any("test_generate.py" in k for k in m.killers), m.id   # the stale-RTL check


@pytest.mark.parametrize("mutant", LIVE, ids=[m.id for m in LIVE])
def test_mutant_is_killed(mutant):
    result = mutate.run_mutant(mutant)
    assert result.status == "killed", f"{mutant.id} {result.status}:\n{result.detail[-3000:]}"
