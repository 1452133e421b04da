"""The C-speed passes of filter and prioritize (issue 30, item 14: a filter reads every node's verdict) give
what the Python passes they replaced gave: the JSON depth check against a walk of the parsed body,
FailedNodes and the feasible names against one-by-one comprehensions, the positions of the nodes with
promises, and the kept rank scores."""

from __future__ import annotations

import json
import random

import pytest

from pyvgpu.cluster.core.model import Decision, NodeInfo, NodeResult
from pyvgpu.cluster.scheduler import httpserve
from pyvgpu.cluster.scheduler.extender import _failed, _rank_scores, rank_scores
from pyvgpu.cluster.scheduler.inflight import _positions


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def _random_value(rng: random.Random, depth: int):
    alphabet = ['\\', '"', '[', ']', '{', '}', 'a', '\n', '\\\\', '\\"', '\u00e9', ' ', '\\u005c']
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
    r = rng.random()
    if depth > 0 and r < 0.35:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if depth > 0 and r < 0.7:
        return {text + str(i): _random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}
    return text if rng.random() < 0.7 else rng.randint(0, 9)


def test_the_depth_check_counts_brackets_outside_strings_only():
    rng = random.Random(7)
    for _ in range(3000):
        value = _random_value(rng, rng.randint(0, 10))
        for ascii_only in (True, False):
            raw = json.dumps(value, ensure_ascii=ascii_only).encode()
            for limit in (0, 1, 2, 3, 5):
                assert httpserve._depth_ok(raw, limit) == (_depth(value) <= limit), (raw, limit)


@pytest.mark.parametrize("text", [r'{"a": "\\"}', r'{"a": "\\\\\"[[[["}', r'{"a": "\"[[[[\\"}', '{"a": "x\\n[[[["}'])
def test_escapes_before_a_quote_do_not_hide_or_invent_brackets(text):
    assert httpserve._depth_ok(text.encode(), 1)
    assert httpserve.parse_object(text.encode(), 1) == json.loads(text)


def test_a_body_nested_too_deep_is_still_refused():
    raw = ("[" * 65 + "]" * 65).encode()
    with pytest.raises(httpserve.BadRequest, match="nests deeper than 64"):
        httpserve.parse_object(b'{"a": ' + raw + b"}")


def _one_by_one(verdicts) -> dict:
    return {n.name: f"pyvgpu: {n.reason}" for n in verdicts if not n.fits}


def test_failed_nodes_as_one_by_one():
    fit = (NodeResult("b", True, 1.0), NodeResult("a", True, 0.5))
    unfit = (NodeResult("c", False, 0.0, "full"), NodeResult("d", False, None, "no registration"))
    assert _failed(fit + unfit, 2) == _one_by_one(fit + unfit)
    assert list(_failed(fit + unfit, 2)) == ["c", "d"]
    mixed = (unfit[0],) + fit + (unfit[1],)  # not the order decide_on writes: read one by one
    assert _failed(mixed, 2) == _one_by_one(mixed)
    assert _failed((), 0) == {}


def test_feasible_keeps_the_order_of_the_verdicts():
    verdicts = (NodeResult("b", True, 1.0), NodeResult("a", False, 0.5, "x"), NodeResult("c", True, 0.0))
    d = Decision("ns/p", "b", (), {}, verdicts, None, "binpack", "binpack")
    assert d.feasible == ["b", "c"]


def test_positions_of_the_promised_nodes_in_order_with_repeats():
    infos = [NodeInfo(n) for n in ["a", "b", "c", "a", "d", "b"]]
    assert _positions(infos, {"a", "b", "z"}) == [0, 1, 3, 5]
    assert _positions(infos, set()) == []


def test_kept_rank_scores_are_rank_scores():
    for n in (0, 1, 2, 3, 7, 1000):
        assert list(_rank_scores(n)) == rank_scores(n)
