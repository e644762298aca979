"""LazyCandidates: a decision's explanations are built once, on first read, and read like
the tuple they stand for."""

from __future__ import annotations

from router.types import CandidateScore, LazyCandidates


def test_built_once_on_first_read() -> None:
    calls: list[int] = []
    scores = (CandidateScore("a", {"hbm": 64}, 1), CandidateScore("b", {}, 0))

    def build() -> tuple[CandidateScore, ...]:
        calls.append(1)
        return scores

    lazy = LazyCandidates(build)
    assert calls == []  # routing never pays for explanations nobody reads
    assert len(lazy) == 2
    assert [c.instance for c in lazy] == ["a", "b"]
    assert lazy[1] is scores[1]
    assert lazy[:1] == scores[:1]
    assert lazy == scores
    assert lazy == LazyCandidates(lambda: scores)
    assert lazy != scores[:1]
    assert calls == [1]
