"""The ``opforge.debug`` metadata entry is untrusted like the rest of a program file: every
load checks it (``verify`` → ``check_debug_table``), whatever else the metadata holds."""

from __future__ import annotations

import dataclasses

import pytest

from opforge.errors import ProgramError
from opforge.program import from_bytes
from opforge.program._sample import sample_program, unverified_bytes

HOSTILE = ('{"version": 1, "methods": {"forward": {"sources": [], "nodes": [], '
           '"captures": [[0, 99999, 0, 0]]}}}', "[" * 100000, "not json",
           '{"version": 2, "methods": {}}', '{"version": 1, "methods": {"nowhere": {}}}')


@pytest.mark.parametrize("table", HOSTILE)
@pytest.mark.parametrize("others", [(), (("author", "someone"),)])
def test_a_hostile_debug_table_is_refused_at_load(table, others):
    program = dataclasses.replace(sample_program(),
                                  user_metadata=(*others, ("opforge.debug", table)))
    with pytest.raises(ProgramError, match="opforge.debug"):
        from_bytes(unverified_bytes(program))


def test_other_metadata_is_not_read_as_a_debug_table():
    program = dataclasses.replace(sample_program(), user_metadata=(("notes", "not json ["),))
    assert from_bytes(unverified_bytes(program)).user_metadata == (("notes", "not json ["),)
