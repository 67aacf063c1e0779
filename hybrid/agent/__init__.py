"""The generate-execute-debug loop, its models, the review gate and the evaluation harness.

    from hybrid.agent import FunctionTask, ScriptedModel, solve
    report = solve(FunctionTask(prompt=..., tests=...), model)

Names load on first use (the openai SDK, the Docker SDK and tree-sitter only when needed).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    **dict.fromkeys(
        [
            "Completion",
            "Message",
            "Model",
            "ModelConfig",
            "OpenAIModel",
            "Prices",
            "ReplayModel",
            "ScriptedModel",
            "Usage",
        ],
        "hybrid.agent.models",
    ),
    **dict.fromkeys(["Breaker", "LoopBudget", "StopReason"], "hybrid.agent.limits"),
    **dict.fromkeys(
        ["Attempt", "Candidate", "FunctionTask", "RepoTask", "RunReport", "solve"],
        "hybrid.agent.loop",
    ),
    # `gate` itself is the submodule here; the function is hybrid.agent.gate.gate.
    **dict.fromkeys(["GateCheck", "GateReport"], "hybrid.agent.gate"),
    **dict.fromkeys(
        ["EvalResult", "Problem", "evaluate", "load_problems", "pass_at_k"],
        "hybrid.agent.evaluation",
    ),
    "MalformedAnswer": "hybrid.agent.edits",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hybrid.agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(_LAZY)
