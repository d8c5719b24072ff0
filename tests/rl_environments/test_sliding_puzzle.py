"""Sliding-puzzle rules: moves, invalid moves, the move cap, solvable seeded starts."""

from __future__ import annotations

import random

import pytest

from rl_environments import SlidingPuzzleDatasetConfig, SlidingPuzzleEnvironment, sliding_puzzle_split
from rl_environments.sliding_puzzle import apply_move, legal_moves, render, scramble, solved_board


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "solve"}, {"role": "assistant", "content": text}]


def test_move_semantics_on_a_3x3_board():
    board = (1, 2, 3, 4, 0, 5, 7, 8, 6)
    assert apply_move(board, 3, "up") == (1, 2, 3, 4, 8, 5, 7, 0, 6)  # tile below the gap slides up
    assert apply_move(board, 3, "down") == (1, 0, 3, 4, 2, 5, 7, 8, 6)
    assert apply_move(board, 3, "left") == (1, 2, 3, 4, 5, 0, 7, 8, 6)
    assert apply_move(board, 3, "right") == (1, 2, 3, 0, 4, 5, 7, 8, 6)
    corner = solved_board(3)  # gap bottom-right: nothing below or to the right of it
    assert apply_move(corner, 3, "up") is None and apply_move(corner, 3, "left") is None
    assert apply_move(corner, 3, "sideways") is None
    assert sorted(legal_moves(corner, 3)) == ["down", "right"]
    assert render(board, 3) == "1 2 3\n4 _ 5\n7 8 6"


def test_solving_gives_reward_and_ends():
    env = SlidingPuzzleEnvironment()
    meta = {"board": [1, 2, 3, 4, 0, 5, 7, 8, 6], "size": 3}
    first = env.step(said("<move>left</move>"), meta, None)
    assert not first.done and first.reward == 0.0 and first.observation.startswith("1 2 3\n4 5 _\n7 8 6")
    second = env.step(said("now <move>up</move>"), meta, first.state)
    assert second.done and second.reward == 1.0 and second.reward_components == {"solved": 1.0}
    assert second.metrics == {"moves": 2.0, "invalid_moves": 0.0}


def test_several_moves_per_turn_and_stop_at_the_first_invalid_one():
    env = SlidingPuzzleEnvironment()
    meta = {"board": [1, 2, 3, 4, 0, 5, 7, 8, 6], "size": 3}
    result = env.step(said("<move>left</move><move>left</move><move>up</move>"), meta, None)
    assert not result.done
    assert result.state == {"board": [1, 2, 3, 4, 5, 0, 7, 8, 6], "moves": 1, "invalid_moves": 1}
    assert "Invalid move 'left'" in result.observation and "legal moves" in result.observation
    solved = env.step(said("<move>left</move><move>up</move><move>down</move>"), meta, None)
    assert solved.done and solved.reward == 1.0 and solved.state["moves"] == 2  # moves after solving are ignored


def test_turn_without_a_move_is_counted_invalid():
    env = SlidingPuzzleEnvironment()
    result = env.step(said("I would slide the 5."), {"board": [1, 2, 3, 4, 0, 5, 7, 8, 6], "size": 3}, None)
    assert not result.done and result.metrics["invalid_moves"] == 1.0 and "No move found" in result.observation


def test_move_cap_ends_the_episode_without_reward():
    env = SlidingPuzzleEnvironment(max_moves=3)
    meta = {"board": [1, 2, 3, 4, 0, 5, 7, 8, 6], "size": 3}
    result = env.step(said("<move>down</move><move>up</move><move>down</move><move>up</move>"), meta, None)
    assert result.done and result.reward == 0.0 and result.state["moves"] == 3


def test_corrupt_state_is_an_error():
    with pytest.raises(ValueError, match="permutation"):
        SlidingPuzzleEnvironment().step(said("<move>up</move>"), {"board": [1, 1, 2, 0], "size": 2}, None)


def test_scrambles_are_solvable_by_reversing_and_seeded():
    rng = random.Random(0)
    for _ in range(20):
        board = scramble(3, 6, rng)
        assert board != solved_board(3)
        assert _solvable_within(board, 3, 6)
    cfg = SlidingPuzzleDatasetConfig(scramble_moves=8, seed=3)
    a = sliding_puzzle_split(cfg, "train", 20)
    b = sliding_puzzle_split(cfg, "train", 20)
    assert len(a) == 20 and [s.metadata for s in a] == [s.metadata for s in b]
    # 3x3 within 5 moves: only 30 boards; the split holds those it owns, none of another split's
    small = SlidingPuzzleDatasetConfig(scramble_moves=5, seed=3)
    train = {str(s.metadata["board"]) for s in sliding_puzzle_split(small, "train", 50)}
    test = {str(s.metadata["board"]) for s in sliding_puzzle_split(small, "test", 50)}
    assert 0 < len(train) < 30 and not train & test


def _solvable_within(board, size, depth) -> bool:
    frontier, seen = {board}, {board}
    for _ in range(depth):
        frontier = {b for f in frontier for m in legal_moves(f, size) if (b := apply_move(f, size, m)) not in seen}
        seen |= frontier
        if solved_board(size) in seen:
            return True
    return solved_board(size) in seen
