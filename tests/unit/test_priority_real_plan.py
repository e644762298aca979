"""bench.priority_real's plan: every arm of a repeat replays the same interactive lines."""

from __future__ import annotations

import argparse

from bench.priority_real import plan

ARGS = argparse.Namespace(seed=7, words=20, interactive_tokens=8, background_tokens=16)


def _text(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"])


def test_every_arm_of_a_repeat_gets_the_same_gaps_and_texts_under_its_own_salt() -> None:
    alone = plan("m", "alone", 0, "i", 12, 0.5, ARGS)
    beside = plan("m", "background", 0, "i", 12, 0.5, ARGS)
    assert [g for g, _ in alone] == [g for g, _ in beside]
    for (_, a), (_, b) in zip(alone, beside, strict=True):
        salt_a, _, text_a = _text(a).partition(" ")
        salt_b, _, text_b = _text(b).partition(" ")
        assert text_a == text_b and salt_a != salt_b  # same line, blocks of its own


def test_repeats_and_kinds_draw_anew() -> None:
    first = plan("m", "alone", 0, "i", 12, 0.5, ARGS)
    assert [g for g, _ in plan("m", "alone", 1, "i", 12, 0.5, ARGS)] != [g for g, _ in first]
    background = plan("m", "background", 0, "b", 12, 0.5, ARGS)
    assert [g for g, _ in background] != [g for g, _ in first]
    assert background[0][1]["max_tokens"] == 16 and first[0][1]["max_tokens"] == 8
