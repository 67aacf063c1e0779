"""Budgets, the circuit breaker and the typed reason every run stops for."""

from __future__ import annotations

import hashlib
import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from hybrid.agent.models import Usage
from hybrid.results import Millis


class StopReason(StrEnum):
    """Why a run stopped."""

    SOLVED = "solved"
    STEPS = "steps"
    TOKENS = "tokens"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    WALL_CLOCK = "wall_clock"
    COST = "cost"
    SANDBOX_TIME = "sandbox_time"
    REPEATED_FAILURE = "repeated_failure"
    REPEATED_EDIT = "repeated_edit"
    MODEL_EXHAUSTED = "model_exhausted"
    MODEL_ERROR = "model_error"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class LoopBudget(BaseModel):
    """Limits of one run; None is unlimited (steps always has a limit)."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(5, ge=1, description="Model rounds (each may hold k candidates).")
    tokens: int | None = Field(None, ge=1, description="Input + output tokens, all calls.")
    input_tokens: int | None = Field(None, ge=1)
    output_tokens: int | None = Field(None, ge=1)
    wall_seconds: float | None = Field(None, gt=0, description="Wall clock of the whole run.")
    cost_usd: float | None = Field(None, ge=0, description="Model cost at the configured prices.")
    sandbox_seconds: float | None = Field(None, gt=0, description="Time spent running candidates.")
    max_output_tokens: int = Field(4096, ge=1, description="Cap of one completion.")
    repeats: int = Field(3, ge=2, description="Same failure or same edit this many times: stop.")


class Meter(BaseModel):
    """What a run has used so far."""

    steps: int = 0
    usage: Usage = Field(default_factory=Usage)
    cost_usd: float = 0.0
    sandbox_ms: Millis = 0.0
    model_ms: Millis = 0.0
    started: float = Field(default_factory=time.monotonic, exclude=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def before_call(budget: LoopBudget, meter: Meter, prompt: int) -> tuple[StopReason | None, int]:
    """Whether a model call of about ``prompt`` input tokens still fits, and its output cap.

    Checked before the call, so a token budget stops the run before it would be exceeded
    (the call's output is capped at what is left).
    """
    used = meter.usage
    room = budget.max_output_tokens
    if budget.wall_seconds is not None and meter.elapsed >= budget.wall_seconds:
        return StopReason.WALL_CLOCK, 0
    if budget.cost_usd is not None and meter.cost_usd >= budget.cost_usd:
        return StopReason.COST, 0
    if budget.sandbox_seconds is not None and meter.sandbox_ms / 1000 >= budget.sandbox_seconds:
        return StopReason.SANDBOX_TIME, 0
    if budget.input_tokens is not None and used.input_tokens + prompt > budget.input_tokens:
        return StopReason.INPUT_TOKENS, 0
    if budget.output_tokens is not None:
        room = min(room, budget.output_tokens - used.output_tokens)
        if room < 1:
            return StopReason.OUTPUT_TOKENS, 0
    if budget.tokens is not None:
        room = min(room, budget.tokens - used.total - prompt)
        if room < 1:
            return StopReason.TOKENS, 0
    return None, room


def after_step(budget: LoopBudget, meter: Meter) -> StopReason | None:
    """A limit the step just used up (checked before the next step starts)."""
    if meter.steps >= budget.steps:
        return StopReason.STEPS
    if budget.wall_seconds is not None and meter.elapsed >= budget.wall_seconds:
        return StopReason.WALL_CLOCK
    if budget.cost_usd is not None and meter.cost_usd >= budget.cost_usd:
        return StopReason.COST
    if budget.sandbox_seconds is not None and meter.sandbox_ms / 1000 >= budget.sandbox_seconds:
        return StopReason.SANDBOX_TIME
    return None


def fingerprint(text: str) -> str:
    """A short hash of ``text`` with whitespace runs collapsed (the same edit, re-indented)."""
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()[:16]


class Breaker:
    """Trips on the same failure signature ``repeats`` times in a row, or the same edit
    ``repeats`` times in the run."""

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats
        self._edits: dict[str, int] = {}
        self._last: str | None = None
        self._streak = 0

    def observe(self, edit: str, signature: str | None) -> StopReason | None:
        edit_key = fingerprint(edit)
        self._edits[edit_key] = self._edits.get(edit_key, 0) + 1
        if signature is not None and signature == self._last:
            self._streak += 1
        else:
            self._streak = 1 if signature is not None else 0
        self._last = signature
        if self._edits[edit_key] >= self.repeats:
            return StopReason.REPEATED_EDIT
        if self._streak >= self.repeats:
            return StopReason.REPEATED_FAILURE
        return None


__all__ = [
    "Breaker",
    "LoopBudget",
    "Meter",
    "StopReason",
    "after_step",
    "before_call",
    "fingerprint",
]
