"""Math: the final answer compared with the gold answer by ``math-verify`` (LaTeX and plain forms).

math-verify guards its own work with ``signal.alarm``, which only works in a process's main thread.
We switch its timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``) and run it in a
small pool of worker processes (forkserver) with our own wall timeout instead: a grading that hangs
costs that sample its reward, and the pool is replaced.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import threading

from rl_core.types import StepResult
from rl_environments.answers import extract_boxed, last_assistant_text, parse_number

logger = logging.getLogger(__name__)


def grade_math(response: str, gold: str) -> dict[str, float]:
    """``{"correct", "format", "integer"}`` for one response, computed with math-verify (call it in a
    worker process: it is not thread-safe). ``format``: a ``\\boxed{}`` is present; ``integer``: the
    boxed answer is a plain integer."""
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    boxed = extract_boxed(response)
    gold_text = gold if "\\boxed" in gold or "$" in gold else f"\\boxed{{{gold}}}"
    gold_parsed = math_verify.parse(gold_text, [LatexExtractionConfig(), ExprExtractionConfig()],
                                    parsing_timeout=None)
    if boxed is None:
        correct = False
    else:
        # Only the boxed answer counts: parse it on its own so numbers elsewhere in the text do not.
        pred = math_verify.parse(f"\\boxed{{{boxed}}}", [LatexExtractionConfig(), ExprExtractionConfig()],
                                 parsing_timeout=None)
        correct = bool(gold_parsed and pred and math_verify.verify(gold_parsed, pred, timeout_seconds=None))
    number = parse_number(boxed)
    return {"correct": float(correct), "format": float(boxed is not None),
            "integer": float(number is not None and number.denominator == 1)}


class MathEnvironment:
    """Single-turn grader for ``metadata['answer']`` (a string: ``"1/2"``, ``"\\frac{1}{2}"``, ``"0.5"``).

    Reward = correct + format_weight * format + integer_weight * integer. Components: ``correct``,
    ``format``, ``integer``. A grading that raises or exceeds ``timeout_s`` scores 0 and reports
    ``metrics['math_verify_error'] = 1``.
    """

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0, format_weight: float = 0.0,
                 integer_weight: float = 0.0):
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.format_weight = format_weight
        self.integer_weight = integer_weight
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def __getstate__(self):  # the pool stays with the process that made it
        state = self.__dict__.copy()
        state["_pool"], state["_lock"] = None, None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _get_pool(self) -> cf.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
                self._pool = cf.ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context(method))
            return self._pool

    def _replace_pool(self, pool: cf.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        kill_pool(pool)

    def grade(self, response: str, gold: str) -> tuple[dict[str, float], bool]:
        """``(components, ok)``; ok is False when grading failed or timed out."""
        pool = self._get_pool()
        try:
            return pool.submit(grade_math, response, str(gold)).result(timeout=self.timeout_s), True
        except cf.TimeoutError:
            logger.warning("math-verify took longer than %.1f s; scoring 0 and replacing the pool", self.timeout_s)
            self._replace_pool(pool)
        except cf.process.BrokenProcessPool:
            self._replace_pool(pool)
        except Exception:  # noqa: BLE001 - a bad answer must not stop training
            logger.exception("math-verify failed")
        return {"correct": 0.0, "format": float(extract_boxed(response) is not None), "integer": 0.0}, False

    def step(self, messages, metadata, state) -> StepResult:
        if "answer" not in metadata:
            raise KeyError("math environment needs metadata['answer']")
        components, ok = self.grade(last_assistant_text(messages), metadata["answer"])
        reward = (components["correct"] + self.format_weight * components["format"]
                  + self.integer_weight * components["integer"])
        return StepResult(reward=reward, reward_components=components, done=True,
                          metrics={"math_verify_error": float(not ok)})

    def close(self) -> None:
        if self._pool is not None:
            kill_pool(self._pool)
            self._pool = None


def kill_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Stop a process pool now, killing workers that are stuck."""
    processes = list((pool._processes or {}).values())  # noqa: SLF001 - no public way to kill a stuck worker
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            try:
                os.kill(process.pid, 9)
            except ProcessLookupError:
                pass
