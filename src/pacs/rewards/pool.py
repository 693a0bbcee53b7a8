"""Score responses in worker processes with a hard wall-clock limit per call.

One bad answer must never stall a training step. ``ScoringPool`` runs a reward function
(``default_compute_score`` by ``data_source``, or a user's ``"package.module:function"``) in
``num_workers`` long-lived worker processes (``pacs.rewards.workers``), each call of
``(data_source, solution_str, ground_truth, extra_info)`` limited to ``timeout_s``:

- a call still running at ``timeout_s``: its worker is killed and replaced, the score is 0.0 and
  counted in ``BatchScores.timed_out``;
- a worker that dies (segfault, ``os._exit``, past ``memory_limit_mib``): replaced, score 0.0,
  counted in ``crashed``;
- an exception raised by the reward function (``sys.exit`` included): re-raised here as
  ValueError naming the row (a bug is not a zero), as is a result that is not a score in [0, 1]
  (``_checked_score``). The same holds with ``num_workers=0``.

It works from any caller: a script with or without an ``if __name__ == "__main__":`` guard, a
script read from standard input, ``python -c``, ``exec``'d code, a worker thread, a process with
torch threads (workers are forks of a server of their own, never of the caller, and never import
the caller's ``__main__``). ``num_workers=0`` scores in this process, sequentially and without
the pool's limit, for debugging; the math verifier still bounds its own symbolic step (see
``pacs.rewards.math``), and each step it stopped or lost (``math_score_timeouts``) is counted in
``timed_out``. Threads may share a pool: their ``score`` calls take turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pacs.rewards.math import math_score_timeouts
from pacs.rewards.registry import RewardCall, _checked_score, _describe_row, load_reward_function, reward_calls
from pacs.rewards.workers import (
    DEFAULT_MEMORY_LIMIT_MIB,
    NO_RESULT,
    CallError,
    TimeLimitedWorkers,
    check_timeout_s,
    exception_text,
)

DEFAULT_FUNCTION_SPEC = "pacs.rewards.registry:default_compute_score"


@dataclass
class BatchScores:
    """Scores of one batch, in response order; calls that timed out or crashed score 0.0;
    `server_restarts`: how often the workers' server was found dead and started again during it."""

    scores: list[float]
    timed_out: int = 0
    crashed: int = 0
    server_restarts: int = 0


class ScoringFailed(ValueError):
    """A reward function gave most answers no score (timed out or crashed) batch after batch."""


FAILING_FRACTION = 0.5
"""A batch fails when at least this fraction of its answers got no score (timed out or crashed)."""


@dataclass
class ScoringWatch:
    """Keeps a run from going on silently on scores that are 0 only because the reward function
    never answered: `observe` each batch's counts; a failing batch (`FAILING_FRACTION`) gets a
    warning naming the function and the remedy, and `stop_after` failing batches in a row (0:
    never) raise `ScoringFailed`.

    `remedy`: the settings that bound scoring, as the command names them (e.g. "reward.timeout_s=1");
    `stop_option`: the setting of `stop_after`; `batch`, `batches`: what a batch is to the user
    ("step", "steps")."""

    function_name: str
    remedy: str
    stop_after: int
    stop_option: str
    batch: str = "step"
    batches: str = "steps"
    max_server_restarts: int = 3
    """Unexpected deaths of the scoring workers' server after which the run stops (0: never)."""
    failing: list[str] = field(default_factory=list)
    """The failing batches in a row so far, e.g. "step 3: 32 of 32"."""
    server_restarts: list[str] = field(default_factory=list)
    """The batches in which the server was found dead, e.g. "step 3"."""

    def observe_restarts(self, label: str, restarts: int) -> str | None:
        """A warning when the scoring workers' server died during the batch `label` and was
        started again, else None; raises `ScoringFailed` at the `max_server_restarts`-th death:
        a server that something keeps killing (a reward's program, the OOM killer) is not one to
        trust with the run's rewards."""
        if not restarts:
            return None
        self.server_restarts += [label] * restarts
        count = len(self.server_restarts)
        if self.max_server_restarts and count >= self.max_server_restarts:
            raise ScoringFailed(
                f"the worker server of reward function {self.function_name} died unexpectedly {count} times "
                f"({', '.join(self.server_restarts)}); stopped. Something kills it (the OOM killer: lower "
                "reward.memory_limit_mib; or code the reward runs); reward.max_server_restarts=0 goes on regardless"
            )
        return (
            f"warning: {label}: the worker server of reward function {self.function_name} died unexpectedly and "
            f"was started again ({count} of {self.max_server_restarts} allowed, reward.max_server_restarts)"
        )

    def _count(self, number: int) -> str:
        return f"{number} {self.batch if number == 1 else self.batches}"

    def observe(self, label: str, timed_out: int, crashed: int, answers: int) -> str | None:
        """A warning when the batch `label` ("step 3") failed, else None; raises `ScoringFailed`
        when it is the `stop_after`-th failing batch in a row."""
        failed = timed_out + crashed
        if not answers or failed < FAILING_FRACTION * answers:
            self.failing.clear()
            return None
        self.failing.append(f"{label}: {failed} of {answers}")
        if self.stop_after and len(self.failing) >= self.stop_after:
            raise ScoringFailed(
                f"reward function {self.function_name} gave no score to most answers in "
                f"{self._count(len(self.failing))} in a row ({'; '.join(self.failing)} timed out or crashed), so they all scored 0; stopped. "
                f"Make it answer within its limits ({self.remedy}), raise them, or set {self.stop_option}=0 to go "
                "on regardless"
            )
        stops = (
            f"; the run stops after {self._count(self.stop_after - len(self.failing))} more like it in a row ({self.stop_option})"
            if self.stop_after
            else ""
        )
        return (
            f"warning: {label}: reward function {self.function_name} gave no score to {failed} of {answers} answers "
            f"({timed_out} timed out, {crashed} crashed), which scored 0. Make it answer within its limits "
            f"({self.remedy}) or raise them{stops}"
        )


QUOTED_RESPONSE_CHARS = 160
"""At most this many characters of a response are quoted in a reward function's error: its start
and its end (where answers are), the middle elided with the count of characters left out."""


def quoted_response(response: str) -> str:
    """`response` as Python writes a string, at most `QUOTED_RESPONSE_CHARS` of it: the first and
    last halves of that many, "…[N characters]…" between them."""
    if len(response) <= QUOTED_RESPONSE_CHARS:
        return repr(response)
    half = QUOTED_RESPONSE_CHARS // 2
    return f"{response[:half]!r}…[{len(response) - 2 * half} characters]…{response[-half:]!r}"


class ScoringPool:
    """Worker processes that score (row, response) pairs, each call limited to ``timeout_s``.

    ``function_spec`` is None for ``default_compute_score`` (by ``data_source``) or
    ``"package.module:function"``, imported here at once so that a wrong name fails early.
    ``timeout_s`` is read at every ``score`` call. ``memory_limit_mib``: how far each worker may
    grow its address space (None: no limit; see ``pacs.rewards.workers``). Use as a context
    manager, or call ``close()``; a later ``score`` starts fresh workers. Workers end with the caller.
    """

    def __init__(
        self,
        function_spec: str | None = None,
        *,
        num_workers: int = 2,
        timeout_s: float = 1.0,
        memory_limit_mib: int | None = DEFAULT_MEMORY_LIMIT_MIB,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0 (0 scores in this process), got {num_workers!r}")
        check_timeout_s(timeout_s)
        self.function_spec = function_spec
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._compute_score = load_reward_function(function_spec)
        self._workers = (
            TimeLimitedWorkers(function_spec or DEFAULT_FUNCTION_SPEC, num_workers=num_workers, memory_limit_mib=memory_limit_mib)
            if num_workers
            else None
        )

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers."""
        if self._workers is not None:
            self._workers.close()

    def score(self, rows: list[dict], responses: list[str]) -> BatchScores:
        """Score ``responses[i]`` against ``rows[i]`` (rows as in ``score_responses``)."""
        calls = reward_calls(rows, responses)
        if self._workers is None:
            timeouts_before = math_score_timeouts()
            scores = [self._score_in_process(call) for call in calls]
            return BatchScores(scores, timed_out=math_score_timeouts() - timeouts_before)
        deaths_before = self._workers.server_deaths
        try:
            outcome = self._workers.run(calls, timeout_s=check_timeout_s(self.timeout_s))
        except CallError as error:
            raise self._function_error(calls[error.index], error.text) from None
        scores = [0.0 if result is NO_RESULT else self._checked(result, call) for call, result in zip(calls, outcome.results)]
        restarts = self._workers.server_deaths - deaths_before
        return BatchScores(scores, timed_out=outcome.timed_out, crashed=outcome.crashed, server_restarts=restarts)

    @property
    def function_name(self) -> str:
        """The reward function, as the user named it (`default_compute_score`: by data_source)."""
        return self.function_spec or "default_compute_score"

    def _function_error(self, call: RewardCall, error_text: str) -> ValueError:
        data_source, response, _, extra_info = call
        where = _describe_row(data_source, extra_info)
        return ValueError(
            f"Reward function {self.function_name} raised for {where}: {error_text} (response: {quoted_response(response)})"
        )

    def _checked(self, result: object, call: RewardCall) -> float:
        """`_checked_score`, its refusal naming the function and quoting the response."""
        try:
            return _checked_score(result, call[0], call[3])
        except ValueError as error:
            raise ValueError(f"Reward function {self.function_name}: {error} (response: {quoted_response(call[1])})") from None

    def _score_in_process(self, call: RewardCall) -> float:
        try:
            result = self._compute_score(*call)
        except (Exception, SystemExit) as error:  # KeyboardInterrupt stays Ctrl-C
            raise self._function_error(call, exception_text(error)) from error
        return self._checked(result, call)
