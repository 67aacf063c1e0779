"""`hybrid solve`, `hybrid gate` and `hybrid eval`: the loop, the review gate, the harness."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from hybrid.cli._output import emit, json_option
from hybrid.errors import InvalidInput
from hybrid.paths import display, read_input, state_dir


def _text(path: Path, what: str) -> str:
    return read_input(path, what).decode("utf-8", "replace")


def _progress(quiet: bool) -> Any:
    if quiet:
        return None
    start = time.monotonic()
    return lambda message: click.echo(f"[{time.monotonic() - start:6.1f}s] {message}", err=True)


def _validated(cls: Any, **values: Any) -> Any:
    try:
        return cls(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        raise InvalidInput(f"--{field.replace('_', '-')}: {error['msg']}") from None


model_options = [
    click.option("--model", "model_name", help="Model name at an OpenAI-compatible endpoint."),
    click.option("--base-url", help="Endpoint base URL (default api.openai.com/v1)."),
    click.option(
        "--api-key-env",
        metavar="VAR",
        help="Environment variable holding the API key ('' for none, e.g. a local server).",
    ),
    click.option("--model-config", type=click.Path(path_type=Path), help="TOML [model] table."),
    click.option(
        "--price-in", type=float, help="USD per million input tokens (for the cost budget)."
    ),
    click.option("--price-out", type=float, help="USD per million output tokens."),
    click.option(
        "--replay", type=click.Path(path_type=Path), help="Play recorded completions (JSONL)."
    ),
    click.option(
        "--record",
        type=click.Path(path_type=Path),
        help="Append every completion to this JSONL file (play it back with --replay).",
    ),
    click.option(
        "--answer",
        "answers",
        multiple=True,
        type=click.Path(path_type=Path),
        help="A file whose text is the model's next answer (repeatable; a scripted model).",
    ),
]


def _with(options: list[Any]) -> Any:
    def decorate(func: Any) -> Any:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def _model(
    model_name: str | None,
    base_url: str | None,
    api_key_env: str | None,
    model_config: Path | None,
    price_in: float | None,
    price_out: float | None,
    replay: Path | None,
    answers: tuple[Path, ...],
) -> Any:
    from hybrid.agent.models import ModelConfig, Prices, ReplayModel, ScriptedModel

    chosen = [bool(model_name or model_config), replay is not None, bool(answers)]
    if sum(chosen) != 1:
        raise InvalidInput("name one model: --model/--model-config, --replay or --answer")
    if replay is not None:
        return ReplayModel(replay)
    if answers:
        return ScriptedModel([_text(p, "answer file") for p in answers], name="answers")
    config = ModelConfig.from_toml(model_config) if model_config else ModelConfig(name="")
    update: dict[str, Any] = {}
    if model_name:
        update["name"] = model_name
    if base_url:
        update["base_url"] = base_url
    if api_key_env is not None:
        update["api_key_env"] = api_key_env or None
    prices = config.prices.model_dump()
    if price_in is not None:
        prices["input_per_million"] = price_in
    if price_out is not None:
        prices["output_per_million"] = price_out
    update["prices"] = _validated(Prices, **prices)
    return config.model_copy(update=update).build()


def _model_from(o: dict[str, Any]) -> Any:
    from hybrid.agent.models import RecordingModel

    if o["record"] is not None:
        return RecordingModel(_model_from({**o, "record": None}), o["record"])
    return _model(
        o["model_name"],
        o["base_url"],
        o["api_key_env"],
        o["model_config"],
        o["price_in"],
        o["price_out"],
        o["replay"],
        o["answers"],
    )


budget_opts = [
    click.option("--steps", type=int, help="Model rounds (default 5)."),
    click.option("--tokens", type=int, help="Token budget, input + output."),
    click.option("--input-tokens", type=int),
    click.option("--output-tokens", type=int),
    click.option("--wall", "wall_seconds", type=float, help="Wall-clock budget, seconds."),
    click.option("--cost", "cost_usd", type=float, help="Cost budget in USD."),
    click.option("--sandbox-seconds", type=float, help="Time budget for running candidates."),
    click.option(
        "--mode",
        type=click.Choice(["retry", "explain"]),
        default="retry",
        show_default=True,
        help="explain: a bug hypothesis before each fix.",
    ),
    click.option("-k", "k", type=int, default=1, show_default=True, help="Candidates per step."),
]


@click.command("solve")
@click.option("--task", "task_text", help="What to do, in words.")
@click.option("--task-file", type=click.Path(path_type=Path), help="The task text from a file.")
@click.option("--function", "function", is_flag=True, help="A function task (python-wasm).")
@click.option("--tests", type=click.Path(path_type=Path), help="Function task: the test file.")
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Function task: an input file (repeatable).",
)
@click.option("--repo", type=click.Path(path_type=Path), help="Repository task: the checkout.")
@click.option("--test", "test_cmd", help="Repository task: the test command.")
@click.option("--regression", help="Repository task: a command that must keep passing.")
@click.option(
    "--related", metavar="RUNNER", help="Test runner for the tests related to the touched files."
)
@click.option("--allow", multiple=True, metavar="PREFIX", help="Allowed path prefix (repeatable).")
@click.option("--deny", multiple=True, metavar="GLOB", help="Extra denied glob (repeatable).")
@click.option("--allow-lockfiles", is_flag=True)
@click.option("--allow-dependencies", is_flag=True)
@click.option(
    "--tests-may-change",
    is_flag=True,
    help="The patch may change the task's tests (not blocked); the task's own still run.",
)
@click.option("--context-tokens", type=int, default=6000, show_default=True)
@click.option(
    "--bundle",
    type=click.Path(path_type=Path),
    help="Evidence bundle directory (default: a new one under the state directory).",
)
@_with(model_options)
@_with(budget_opts)
@click.option("--quiet", "-q", is_flag=True, help="No live progress.")
@json_option
def solve_cmd(**o: Any) -> None:
    """Generate, run, read the evidence, repair; gate the result for human review.

    Exit 0 when a candidate passed and the gate says ready for human review, 1 otherwise.
    """
    from hybrid.agent.limits import LoopBudget
    from hybrid.agent.loop import FunctionTask, RepoTask, solve

    if o["task_file"] is not None:
        o["task_text"] = _text(o["task_file"], "task file")
    if not (o["task_text"] or "").strip():
        raise InvalidInput("solve needs a task: --task TEXT or --task-file FILE")
    if o["function"]:
        if o["tests"] is None:
            raise InvalidInput("a function task needs --tests FILE")
        task: Any = _validated(
            FunctionTask,
            prompt=o["task_text"],
            tests=_text(o["tests"], "test file"),
            files={p.name: _text(p, "input file") for p in o["files"]},
        )
    else:
        if o["repo"] is None or not o["test_cmd"]:
            raise InvalidInput("a repository task needs --repo DIR and --test CMD (or --function)")
        if not o["repo"].is_dir():
            raise InvalidInput(f"{display(o['repo'])}: not a directory")
        task = _validated(
            RepoTask,
            task=o["task_text"],
            repo=o["repo"],
            test=o["test_cmd"],
            regression=o["regression"],
            related=o["related"],
            allow=list(o["allow"]),
            deny=list(o["deny"]),
            allow_lockfiles=o["allow_lockfiles"],
            allow_dependencies=o["allow_dependencies"],
            tests_may_change=o["tests_may_change"],
            context_tokens=o["context_tokens"],
        )
    budget = _validated(
        LoopBudget,
        steps=o["steps"],
        tokens=o["tokens"],
        input_tokens=o["input_tokens"],
        output_tokens=o["output_tokens"],
        wall_seconds=o["wall_seconds"],
        cost_usd=o["cost_usd"],
        sandbox_seconds=o["sandbox_seconds"],
    )
    model = _model_from(o)
    stamp = time.strftime("%Y%m%d-%H%M%S-") + f"{time.time_ns() % 10**6:06d}"
    bundle = o["bundle"] or state_dir("runs") / stamp
    report = solve(
        task,
        model,
        budget=budget,
        mode=o["mode"],
        k=o["k"],
        bundle=Path(bundle),
        progress=_progress(o["quiet"]),
    )

    def render() -> None:
        meter = report.meter
        click.echo(f"stop: {report.stop.value} ({report.stop_detail})")
        click.echo(f"disposition: {report.disposition}")
        if report.gate is not None:
            for reason in report.gate.reasons:
                click.echo(f"  - {reason}")
        click.echo(
            f"steps {meter.steps}, tokens {meter.usage.input_tokens}/{meter.usage.output_tokens}, "
            f"cost ${meter.cost_usd:.4f}, sandbox {meter.sandbox_ms:.0f} ms"
        )
        click.echo(f"bundle: {report.bundle}")

    emit(report, o["as_json"], render)
    if not (report.solved and report.gate is not None and report.gate.ready):
        raise click.exceptions.Exit(1)


@click.command("gate")
@click.argument("patch", type=click.Path(path_type=Path))
@click.option("--repo", type=click.Path(path_type=Path), required=True, help="The checkout.")
@click.option("--test", "test_cmd", required=True, help="Task test command (must pass).")
@click.option("--regression", help="Regression command (must keep passing).")
@click.option(
    "--related",
    metavar="RUNNER",
    help="Test runner (e.g. 'python3 -m pytest -q') for the tests related to the touched files.",
)
@click.option("--allow", multiple=True, metavar="PREFIX", help="Allowed path prefix (repeatable).")
@click.option("--deny", multiple=True, metavar="GLOB", help="Extra denied glob (repeatable).")
@click.option("--allow-lockfiles", is_flag=True)
@click.option("--allow-dependencies", is_flag=True, help="Dependency changes were admitted.")
@click.option(
    "--tests-may-change",
    is_flag=True,
    help="The patch may change the task's tests (not blocked); the task's own still run.",
)
@click.option(
    "--deps/--no-deps",
    default=None,
    help="Install the project's admitted dependencies offline (default: when it declares any).",
)
@click.option("--image", help="Workstation image (default the base image; the layer builds on it).")
@click.option("--quiet", "-q", is_flag=True, help="No live progress.")
@json_option
def gate_cmd(
    patch: Path,
    repo: Path,
    test_cmd: str,
    regression: str | None,
    related: str | None,
    allow: tuple[str, ...],
    deny: tuple[str, ...],
    allow_lockfiles: bool,
    allow_dependencies: bool,
    tests_may_change: bool,
    deps: bool | None,
    image: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Decide whether PATCH (a unified diff, - for stdin) is ready for human review.

    Never merges or pushes. Exit 0 ready, 1 blocked (every reason listed; an empty patch is
    blocked: it changes nothing). The tests that judge are the task's: the paths --test and
    --regression name, and the test machinery, are restored before anything runs.
    """
    from hybrid.agent.gate import gate
    from hybrid.checks import scope

    text = sys.stdin.read() if str(patch) == "-" else _text(patch, "patch")
    if text.strip():
        scope(text)  # a patch that does not parse is bad input (InvalidDiff), not a blocked gate
    report = gate(
        text,
        repo,
        test=test_cmd,
        regression=regression,
        related=related,
        allow=allow,
        deny=deny,
        allow_lockfiles=allow_lockfiles,
        allow_dependencies=allow_dependencies,
        tests_may_change=tests_may_change,
        deps=deps,
        image=image,
        progress=_progress(quiet),
    )

    def render() -> None:
        for check in report.checks:
            mark = "pass" if check.passed else "FAIL"
            click.echo(f"{mark:4} {check.name}: {check.detail}")
        click.echo(report.disposition)

    emit(report, as_json, render)
    if not report.ready:
        raise click.exceptions.Exit(1)


@click.command("eval")
@click.argument("problems", type=click.Path(path_type=Path))
@click.option(
    "--builtin",
    type=click.Choice(["oracle", "null", "wrong-then-right"]),
    help="A reference model that proves the harness.",
)
@_with(model_options)
@click.option("--samples", "-n", type=int, default=1, show_default=True, help="Runs per problem.")
@click.option("--pass-at", "ks", multiple=True, type=int, help="k of pass@k (repeatable).")
@click.option("--steps", type=int, default=3, show_default=True, help="Loop steps per run.")
@click.option("--quiet", "-q", is_flag=True, help="No live progress.")
@click.option(
    "--ray",
    metavar="ADDRESS",
    help="Spread the runs across the Ray cluster at ADDRESS (host:port).",
)
@json_option
def eval_cmd(**o: Any) -> None:
    """Run PROBLEMS (JSONL) through the loop; unbiased pass@k.

    HumanEval-format lines are function tasks (python-wasm); lines with FAIL_TO_PASS are
    repository instances from real fix commits (workstations; solved = the gate says ready).
    """
    from hybrid.agent.evaluation import (
        builtin_model,
        builtin_repo_model,
        evaluate,
        evaluate_repo,
        load_instances,
        load_problems,
    )
    from hybrid.agent.limits import LoopBudget

    # Lines naming FAIL_TO_PASS are repository instances; the rest HumanEval problems.
    head = read_input(o["problems"], "problem file")[:65536]
    repository = b'"FAIL_TO_PASS"' in head
    problems: Any = (load_instances if repository else load_problems)(o["problems"])
    budget = _validated(LoopBudget, steps=o["steps"])
    if o["builtin"]:
        kind = o["builtin"]
        reference = builtin_repo_model if repository else builtin_model

        def model_for(problem: Any) -> Any:
            return reference(kind, problem)
    else:
        model = _model_from(o)

        def model_for(problem: Any) -> Any:
            return model

    result = (evaluate_repo if repository else evaluate)(
        problems,
        model_for,
        samples=o["samples"],
        ks=o["ks"] or (1,),
        budget=budget,
        progress=_progress(o["quiet"]),
        ray=o["ray"],
    )

    def render() -> None:
        click.echo(f"model {result.model}: {result.problems} problems x {result.samples} samples")
        for k, value in result.pass_at.items():
            click.echo(f"pass@{k}: {value:.1%}")
        steps = ", ".join(f"step {s}: {n}" for s, n in result.solved_at_step.items()) or "none"
        click.echo(f"solved at: {steps}")
        click.echo(f"tokens {result.tokens}, cost ${result.cost_usd:.4f}")

    emit(result, o["as_json"], render)
