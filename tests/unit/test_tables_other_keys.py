"""twin.tables.decode_table(other_keys=...): keys a caller takes out of a table before decoding it
(a run scenario's sections, an optimize scenario's ``[[jobs]]`` and ``[[queue]]``, a fault's ``kind``)
are known keys for the unknown-key message: a typo of one is pointed at it, and they are listed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from twin.tables import SpecError, decode_table

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class _Top:
    name: str
    site: str | None = None
    ready_reserve_cards: int = 0


def _message(data: dict[str, object], other_keys: tuple[str, ...] = ()) -> str:
    with pytest.raises(SpecError) as info:
        decode_table(_Top, data, "s.toml", other_keys=other_keys)
    return str(info.value)


def test_a_typo_of_a_key_the_caller_decodes_is_pointed_at_it() -> None:
    """`[[job]]` in an optimize scenario got the list of the other keys, without 'jobs'."""
    assert (
        _message({"name": "x", "job": []})
        == "s.toml: job: unknown key; known keys here: name, site, ready_reserve_cards"
    )
    assert _message({"name": "x", "job": []}, ("jobs", "queue")) == "s.toml: job: unknown key; did you mean 'jobs'?"
    assert _message({"name": "x", "queues": []}, ("jobs", "queue")) == (
        "s.toml: queues: unknown key; did you mean 'queue'?"
    )


def test_the_known_keys_list_the_keys_the_caller_decodes() -> None:
    assert _message({"name": "x", "zzz": 1}, ("jobs", "queue")) == (
        "s.toml: zzz: unknown key; known keys here: name, site, ready_reserve_cards, jobs, queue"
    )


def test_the_other_keys_change_nothing_else() -> None:
    assert decode_table(_Top, {"name": "x"}, "s.toml", other_keys=("jobs",)) == _Top("x")
    with pytest.raises(SpecError, match="name: missing required value"):
        decode_table(_Top, {}, "s.toml", other_keys=("jobs",))
