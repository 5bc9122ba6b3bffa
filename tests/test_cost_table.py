"""The cost table (issue #34 item 2): round trip, refusals of anything a stranger's file can hold,
and the documented default of an unknown key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer.dispatch.cost import job_costs, message_key, table_cost
from tracer.dispatch.costtable import (
    FORMAT,
    MAX_BYTES,
    MAX_ENTRIES,
    MAX_KEY_CHARS,
    VERSION,
    CostTable,
    CostTableError,
    learn_costs,
    load_costs,
    parse_costs,
)


def _doc(costs: Any, **over: Any) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION, "unit": "s", "costs": costs, **over})


def test_learn_save_load_round_trip(tmp_path: Path) -> None:
    learned = learn_costs([("a", 1.0), ("a", 3.0), ("a", 2.0), ("b", 0.25), (None, 9.0), ("", 9.0)])
    assert dict(learned.costs) == {"a": 2.0, "b": 0.25}  # the median per key; keyless samples left out
    path = learned.save(tmp_path / "sub" / "costs.json")
    loaded = load_costs(path)
    assert loaded == learned
    assert json.loads(path.read_text())["format"] == FORMAT
    assert not list(path.parent.glob(".costs.json.*"))  # the temporary file was renamed, not left


@given(st.dictionaries(st.text(st.characters(codec="utf-8"), min_size=1, max_size=MAX_KEY_CHARS)
                       .filter(str.isprintable),
                       st.floats(min_value=0, max_value=1e9, allow_nan=False), max_size=30))
@settings(max_examples=60, deadline=None)
def test_any_table_round_trips(costs: dict[str, float]) -> None:
    table = CostTable(costs)
    assert parse_costs(json.dumps(table.as_dict())) == table


def test_unknown_key_takes_the_median_or_its_group() -> None:
    table = CostTable({"suite-a/1": 1.0, "suite-a/2": 3.0, "suite-b/1": 10.0, "suite-b/2": 20.0, "suite-b/3": 30.0})
    assert table.default == 10.0  # the median of all five
    assert table.cost("suite-a/1") == 1.0
    assert table.cost("new") == table.cost(None) == 10.0
    grouped = table.with_group(lambda k: k.split("/")[0])
    assert grouped.cost("suite-a/9") == 2.0  # the median of its group
    assert grouped.cost("suite-c/1") == 10.0  # no known group: the table's median
    assert CostTable({}).cost("x") == 0.0


def test_table_cost_is_a_consume_loop_cost_function() -> None:
    class M:
        def __init__(self, keys: Any) -> None:
            self.keys = keys

    cost = table_cost(CostTable({"a": 2.5, "b": 0.5, "c": 1.0}))
    assert [cost(M("a")), cost(M(["b", "x"])), cost(M(None)), cost(M(("zz",)))] == [2.5, 0.5, 1.0, 1.0]
    assert message_key(M([])) is None and message_key(M("")) is None and message_key(M(set())) is None
    assert message_key(M({"b", "a"})) == "a"  # a 5.x message's keys are a set: the smallest, every time
    with pytest.raises(TypeError, match="CostTable"):
        table_cost({"a": 1.0})  # type: ignore[arg-type]


# -- refusals ---------------------------------------------------------------------------------
BAD_ENTRIES: list[tuple[Any, str]] = [
    ("nan", "not a number"), (None, "not a number"), (True, "not a number"), ([1], "not a number"),
    ({"s": 1}, "not a number"), (-0.5, ">= 0"), (1e300, "too large"), (10**400, "too large"),
]


@pytest.mark.parametrize(("value", "said"), BAD_ENTRIES)
def test_a_bad_entry_is_refused_by_name(value: Any, said: str) -> None:
    text = _doc({"good": 1.0, "tg-0042": value}) if value != 10**400 else _doc({"good": 1.0}).replace(
        '"good": 1.0', '"good": 1.0, "tg-0042": ' + "1" + "0" * 400)
    with pytest.raises(CostTableError, match=rf"costs.json: entry 'tg-0042': cost .* {said}"):
        parse_costs(text, source="costs.json")


@pytest.mark.parametrize(("text", "said"), [
    ("", "not JSON"), ("{", "not JSON"), (b"\xff\xfe", "not JSON"), ("[1]", "not a cost table"),
    (json.dumps({"version": 1, "costs": {}}), "not a cost table"),
    (_doc({}, version=2), "version 2 \\(written by a newer rmqtrace\\)"), (_doc({}, version="1"), "whole number"),
    (_doc({}, version=True), "whole number"), (_doc({}, unit="ms"), "unit 'ms'"), (_doc([1.0]), "not an object"),
    (_doc({"a": 1.0}).replace("1.0", "NaN"), "NaN is not a cost"),
    (_doc({"a": 1.0}).replace("1.0", "Infinity"), "Infinity is not a cost"),
    (_doc({"": 1.0}), "not a non-empty string"), (_doc({"a\x00b": 1.0}), "unprintable"),
    (_doc({"k" * (MAX_KEY_CHARS + 1): 1.0}), "longer than"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
])
def test_a_bad_file_is_refused_with_one_clear_error(text: str | bytes, said: str) -> None:
    with pytest.raises(CostTableError, match=f"^costs: .*{said}"):
        parse_costs(text)


def test_size_bounds(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_BYTES + 1))
    with pytest.raises(CostTableError, match="larger than"):
        load_costs(big)
    with pytest.raises(CostTableError, match="more than"):
        parse_costs(_doc({f"k{i}": 1.0 for i in range(MAX_ENTRIES + 1)}))
    with pytest.raises(CostTableError, match="cannot read"):
        load_costs(tmp_path / "missing.json")


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=20))
@settings(max_examples=200, deadline=None)
def test_junk_costs_are_refused_or_loaded_whole(junk: Any) -> None:
    """Whatever a stranger puts under "costs" (or as the document): a table whose every cost is a
    finite number >= 0, or CostTableError — never another exception."""
    for text in (_doc(junk), json.dumps(junk), _doc({"k": junk})):
        try:
            table = parse_costs(text)
        except CostTableError:
            continue
        assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in table.costs.values())


# -- the producer's costs: loud, naming the message ------------------------------------------
class Msg:
    def __init__(self, key: str, cost: Any) -> None:
        self.keys = key
        self.cost = cost


@pytest.mark.parametrize("bad", [math.nan, -1.0, "3", None, math.inf, 10**400, True])
def test_job_costs_names_the_message_with_a_junk_cost(bad: Any) -> None:
    msgs = [Msg("a", 1.0), Msg("b", 2.0), Msg("tg-7", bad)]
    with pytest.raises(CostTableError, match=r"^message 2 \(key 'tg-7'\): cost"):
        job_costs(msgs, lambda m: m.cost)


def test_job_costs_names_the_message_a_cost_function_raised_on() -> None:
    def cost(m: Msg) -> float:
        return {"a": 1.0}[m.keys]

    with pytest.raises(CostTableError, match=r"cost= raised KeyError for message 1 \(key 'b'\)") as err:
        job_costs([Msg("a", 0), Msg("b", 0)], cost)
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(TypeError, match="function of the message or a CostTable"):
        job_costs([Msg("a", 0)], 3.0)  # type: ignore[arg-type]


def test_job_costs_from_a_table() -> None:
    assert job_costs([Msg("a", 0), Msg("new", 0)], CostTable({"a": 4.0, "b": 1.0, "c": 2.0})) == [4.0, 2.0]


def test_cost_aware_reads_the_table_through_table_cost() -> None:
    """``cost_aware`` with ``cost=table_cost(table)``: among the waiting messages the table's most
    expensive starts first, an unknown key at the table's median (no engine change: the cost= seam)."""
    from test_dispatch_engine import Gates

    from tracer.dispatch import CostAware, Dispatcher

    class M:
        def __init__(self, key: str) -> None:
            self.keys = key

        def __repr__(self) -> str:
            return self.keys

    table = CostTable({"first": 0.1, "short": 0.2, "long": 5.0, "mid": 1.0})  # median 0.6
    g = Gates()
    d = Dispatcher(g.handler, workers=1, policy=CostAware(window=10), cost=table_cost(table))
    first = M("first")
    d.submit(first)
    g.wait_started(first)
    waiting = [M("short"), M("new"), M("long"), M("mid")]
    for m in waiting:
        assert d.submit(m, timeout=0)
    g.open(*waiting)
    g.open(first)
    d.close()
    assert [m.keys for m in g.order] == ["first", "long", "mid", "new", "short"]
