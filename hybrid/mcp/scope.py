"""What an MCP server may touch: its repository roots and the policy it was started with.

Every tool call goes through one ``Scope``: a host path must lie inside a root (symlinks
resolved) and must not be or contain a host secret path; a run gets the server's spec for its
tier, admitted (``hybrid.policy.enforce``) before anything starts, and a call may only narrow
the deadline, never widen it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from hybrid.errors import InvalidInput, PolicyViolation
from hybrid.paths import display
from hybrid.policy import SandboxSpec, check_input_path, enforce

Kind = Literal["dir", "file", "any"]


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class Scope:
    """The roots and the policy of one server; every path and every spec a tool uses comes from here."""

    def __init__(self, roots: list[Path], spec: SandboxSpec | None = None) -> None:
        if not roots:
            raise InvalidInput("an MCP server needs at least one repository root")
        resolved = []
        for root in roots:
            if not root.is_dir():
                raise InvalidInput(f"root {display(root)}: not a directory")
            # A root that is, or holds, a secret path (a home directory holds ~/.ssh) would
            # hand every client that path.
            check_input_path(root, "root")
            resolved.append(root.resolve())
        self.roots = resolved
        self.spec = spec
        if spec is not None:
            enforce(spec)

    def path(self, raw: str, what: str, kind: Kind = "any") -> Path:
        """``raw`` (relative to the first root) resolved; refused outside the roots or on a secret path."""
        if not raw or "\0" in raw:
            raise InvalidInput(f"{what}: give a path")
        given = Path(raw).expanduser()
        path = (given if given.is_absolute() else self.roots[0] / given).resolve()
        if not any(_within(path, root) for root in self.roots):
            shown = ", ".join(str(r) for r in self.roots)
            raise PolicyViolation([f"{what} {display(raw)}: outside the server's roots ({shown})"])
        check_input_path(path, what)
        if not path.exists():
            raise InvalidInput(f"{what} {display(raw)}: no such file or directory")
        if kind == "dir" and not path.is_dir():
            raise InvalidInput(f"{what} {display(raw)}: not a directory")
        if kind == "file" and not path.is_file():
            raise InvalidInput(f"{what} {display(raw)}: not a file")
        return path

    def spec_for(self, tier: str, wall_seconds: float | None = None) -> SandboxSpec:
        """The server's spec on ``tier`` (its tier's default without a policy), admitted.

        ``wall_seconds`` narrows the deadline; asking for more than the policy allows is refused.
        """
        if self.spec is None:
            spec = _default(tier)
        elif self.spec.tier not in ("auto", tier):
            raise PolicyViolation(
                [f"tier {tier}: the server's policy allows only the {self.spec.tier} tier"]
            )
        else:
            spec = self.spec.model_copy(update={"tier": tier})
        if wall_seconds is not None:
            if not (math.isfinite(wall_seconds) and wall_seconds > 0):
                raise InvalidInput(f"timeout {wall_seconds}: give a positive number of seconds")
            if wall_seconds > spec.budget.wall_seconds:
                raise PolicyViolation(
                    [
                        f"timeout {wall_seconds:g} s is above the server's budget of "
                        f"{spec.budget.wall_seconds:g} s"
                    ]
                )
            budget = spec.budget.model_copy(update={"wall_seconds": wall_seconds})
            spec = spec.model_copy(update={"budget": budget})
        return enforce(spec, tier)


def _default(tier: str) -> SandboxSpec:
    """Each tier's own default when the server has no policy (what the CLI uses)."""
    if tier == "python-wasm":
        from hybrid.wasm.python import DEFAULT_SPEC

        return DEFAULT_SPEC
    if tier in ("docker", "gvisor"):
        from hybrid.agent.gate import DEFAULT_SPEC as WORKSTATION_SPEC

        return WORKSTATION_SPEC.model_copy(update={"tier": tier})
    return SandboxSpec(tier=tier)
