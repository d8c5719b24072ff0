"""Sliding puzzle: the N x N sliding-tile game, played over several turns.

The model sends moves as ``<move>up</move>`` (several per turn allowed, applied in order). A move
names the direction a TILE slides into the empty square: ``up`` moves the tile below the gap up,
``left`` moves the tile right of the gap to the left, and so on. The environment answers with the
new board. Solved means tiles 1 .. N*N-1 in reading order with the gap last.
"""

from __future__ import annotations

import random
import re
from typing import Literal

from pydantic import Field

from rl_core.types import PromptSample, StepResult
from rl_environments.answers import last_assistant_text
from rl_environments.dataset_base import PromptDatasetConfig
from rl_environments.prompts import user_messages
from rl_environments.splits import Split, generate_split

Board = tuple[int, ...]  # row-major, 0 is the gap
MOVES = ("up", "down", "left", "right")
# Where the tile that moves sits relative to the gap, as (row, column) offsets.
_TILE_OFFSET = {"up": (1, 0), "down": (-1, 0), "left": (0, 1), "right": (0, -1)}
_MOVE = re.compile(r"<move>\s*(.*?)\s*</move>", re.DOTALL | re.IGNORECASE)


def solved_board(size: int) -> Board:
    return (*range(1, size * size), 0)


def apply_move(board: Board, size: int, move: str) -> Board | None:
    """The board after ``move``, or None when the move is not possible (no such word, or off the edge)."""
    if move not in _TILE_OFFSET:
        return None
    gap = board.index(0)
    row, col = divmod(gap, size)
    d_row, d_col = _TILE_OFFSET[move]
    tile_row, tile_col = row + d_row, col + d_col
    if not (0 <= tile_row < size and 0 <= tile_col < size):
        return None
    tile = tile_row * size + tile_col
    cells = list(board)
    cells[gap], cells[tile] = cells[tile], 0
    return tuple(cells)


def legal_moves(board: Board, size: int) -> list[str]:
    return [m for m in MOVES if apply_move(board, size, m) is not None]


def scramble(size: int, num_moves: int, rng: random.Random) -> Board:
    """A solvable start: ``num_moves`` random moves from the solved board, never undoing the last one
    (redrawn if it lands back on the solved board)."""
    opposite = {"up": "down", "down": "up", "left": "right", "right": "left"}
    while True:
        board, last = solved_board(size), None
        for _ in range(num_moves):
            move = rng.choice([m for m in legal_moves(board, size) if m != opposite.get(last)])
            board, last = apply_move(board, size, move), move
        if board != solved_board(size) or num_moves == 0:
            return board


def render(board: Board, size: int) -> str:
    width = len(str(size * size - 1))
    rows = [" ".join("_".rjust(width) if v == 0 else str(v).rjust(width) for v in board[r * size:(r + 1) * size])
            for r in range(size)]
    return "\n".join(rows)


class SlidingPuzzleDatasetConfig(PromptDatasetConfig):
    """Settings of the sliding-puzzle starts."""

    kind: Literal["sliding_puzzle"] = "sliding_puzzle"
    seed: int = 0
    size: int = Field(3, ge=2, le=6)
    """Board side N (N x N board)."""
    scramble_moves: int = Field(8, ge=1, le=200)
    """Difficulty: random moves from the solved board."""
    train_size: int = Field(1000, gt=0)
    validation_size: int = Field(50, ge=0)
    test_size: int = Field(50, ge=0)
    system_prompt: str | None = None

    def generate(self, split: Split, size: int | None) -> list[PromptSample]:
        return sliding_puzzle_split(self, split, size)


def sliding_puzzle_split(cfg: SlidingPuzzleDatasetConfig, split: Split, size: int | None = None) -> list[PromptSample]:
    """Up to ``size`` distinct starts owned by ``split``. Few boards exist at small difficulty (20 on a
    3x3 board within 4 moves), so a split may hold fewer than asked for, never a board of another split."""
    size = getattr(cfg, f"{split}_size") if size is None else size
    boards = generate_split(lambda rng: scramble(cfg.size, cfg.scramble_moves, rng), str, seed=cfg.seed,
                            split=split, size=size, name=f"sliding-{cfg.size}-k{cfg.scramble_moves}",
                            exhaust_ok=True)
    return [_sample(board, cfg) for board in boards]


def _sample(board: Board, cfg: SlidingPuzzleDatasetConfig) -> PromptSample:
    goal = render(solved_board(cfg.size), cfg.size)
    question = (
        f"Solve this {cfg.size}x{cfg.size} sliding puzzle (_ is the empty square):\n{render(board, cfg.size)}\n\n"
        f"Goal:\n{goal}\n\nMove a tile into the empty square with <move>DIRECTION</move>, where DIRECTION is "
        "up, down, left or right: the direction the tile slides (up moves the tile below the gap up). "
        "You may send several moves per turn."
    )
    return PromptSample(messages=user_messages(question, cfg.system_prompt),
                        metadata={"board": list(board), "size": cfg.size}, env="sliding_puzzle")


class SlidingPuzzleEnvironment:
    """Reward 1 (component ``solved``) when the board is solved; 0 when the move cap is reached.

    Invalid moves (unknown word, off the edge, or a turn without any ``<move>``) do not change the board;
    they are counted (``invalid_moves`` metric) and explained in the reply. The rest of a turn's moves
    after an invalid one are skipped.
    """

    def __init__(self, max_moves: int = 50):
        self.max_moves = max_moves

    def step(self, messages, metadata, state) -> StepResult:
        size = int(metadata["size"])
        if state is None:
            state = {"board": list(metadata["board"]), "moves": 0, "invalid_moves": 0}
        board: Board = tuple(state["board"])
        if sorted(board) != list(range(size * size)):
            raise ValueError(f"sliding puzzle board {board} is not a permutation of 0..{size * size - 1}")
        moves = [m.lower() for m in _MOVE.findall(last_assistant_text(messages))]
        notes, moves_made, invalid = [], 0, 0
        if not moves:
            invalid, notes = 1, ["No move found: send a move like <move>up</move>."]
        for move in moves:
            if state["moves"] + moves_made >= self.max_moves:
                break
            new_board = apply_move(board, size, move)
            if new_board is None:
                invalid += 1
                reason = "not a direction" if move not in MOVES else "no tile can slide that way"
                notes.append(f"Invalid move {move!r} ({reason}); legal moves: {', '.join(legal_moves(board, size))}.")
                break
            board, moves_made = new_board, moves_made + 1
            if board == solved_board(size):
                break
        state = {"board": list(board), "moves": state["moves"] + moves_made,
                 "invalid_moves": state["invalid_moves"] + invalid}
        solved = board == solved_board(size)
        done = solved or state["moves"] >= self.max_moves
        metrics = {"moves": float(state["moves"]), "invalid_moves": float(state["invalid_moves"])}
        if solved:
            notes.append("Solved!")
        elif done:
            notes.append(f"Move limit of {self.max_moves} reached.")
        observation = "\n".join([render(board, size), *notes])
        return StepResult(observation=None if done else observation, reward=float(solved),
                          reward_components={"solved": float(solved)}, done=done, metrics=metrics, state=state)
