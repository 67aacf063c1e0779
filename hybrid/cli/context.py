"""``hybrid map``, ``hybrid skeleton`` and ``hybrid context``: real-file context from a checkout."""

from __future__ import annotations

from typing import Any

import click

from hybrid.cli._output import emit, json_option
from hybrid.cli._progress import progress as _progress
from hybrid.paths import printable

_MODES = click.Choice(["fused", "bm25", "graph"])
_VARIANT_LABELS = {
    "full": "full (symbol ranking)",
    "no-symbol-ranking": "- symbol ranking (file-first pack)",
    "no-name": "- symbol names",
    "no-text": "- body text",
    "no-graph": "- callers/callees",
    "no-tests": "- test names",
    "no-history": "- recent history",
    "no-similar": "- similar past commits",
    "files-bm25": "files by BM25 only",
    "files-graph": "files by graph only",
}


@click.command("map")
@click.argument("path", default=".", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--task", default="", help="Task text: ranks files for it (identifiers, paths, words)."
)
@click.option(
    "--tokens", default=2048, show_default=True, type=click.IntRange(min=1), help="Token budget."
)
@click.option("--mode", type=_MODES, default="fused", show_default=True, help="Ranking signal.")
@json_option
def map_cmd(path: str, task: str, tokens: int, mode: str, as_json: bool) -> None:
    """Print a ranked map of the repository at PATH: files with their key signatures."""
    from hybrid.context.repomap import repo_map

    with _progress("parsing files") as progress:
        result = repo_map(path, task, tokens, mode=mode, progress=progress)  # type: ignore[arg-type]

    def render() -> None:
        click.echo(result.text, nl=False)
        _skipped(result.skipped)
        quiet = len(result.files_without_symbols)
        if quiet or result.skipped:
            click.echo(
                f"# {quiet} files without symbols, {len(result.skipped)} skipped (see --json)",
                err=True,
            )

    emit(result, as_json, render)


@click.command("skeleton")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@json_option
def skeleton_cmd(files: tuple[str, ...], as_json: bool) -> None:
    """Print FILES with bodies elided: imports, signatures, decorators, docstrings, constants."""
    from hybrid.context.skeletons import skeleton

    result = [{"path": f, "skeleton": skeleton(f)} for f in files]

    def render() -> None:
        for item in result:
            if len(result) > 1:
                click.echo(f"# {printable(item['path'])}")
            click.echo(item["skeleton"], nl=False)

    emit(result, as_json, render)


def _skipped(skipped: list[str]) -> None:
    """Name every source file left out (a symlink, a FIFO...): the reader must know why."""
    for line in skipped:
        click.echo(f"# skipped {printable(line)}", err=True)


class _DefaultToPack(click.Group):
    """``hybrid context [PATH] --task ...`` packs; ``hybrid context eval REPO`` evaluates."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_help = bool(args) and args[0] in ("-h", "--help")
        if not wants_help and (not args or args[0] not in self.commands):
            args = ["pack", *args]
        return super().parse_args(ctx, args)


@click.group("context", cls=_DefaultToPack)
def context() -> None:
    """Build a task context pack (default) or evaluate ranking on the repo's history (eval)."""


@context.command("pack")
@click.argument("path", default=".", type=click.Path(exists=True, file_okay=False))
@click.option("--task", required=True, help="What the model is asked to do.")
@click.option(
    "--tokens", default=8000, show_default=True, type=click.IntRange(min=64), help="Token budget."
)
@click.option("--mode", type=_MODES, default="fused", show_default=True, help="Ranking signal.")
@json_option
def pack_cmd(path: str, task: str, tokens: int, mode: str, as_json: bool) -> None:
    """Fill one budget with the ranked map, top files, neighbour skeletons and related tests."""
    from hybrid.context.pack import context_pack

    with _progress("parsing files") as progress:
        result = context_pack(path, task, tokens, mode=mode, progress=progress)  # type: ignore[arg-type]

    def render() -> None:
        for item in result.items:
            head = f"{item.kind} {item.path or ''} ({item.tokens} tokens): {item.reason}"
            click.echo(f"=== {printable(head)}")
            click.echo(item.text.rstrip("\n"))
        _skipped(result.skipped)
        click.echo(f"=== {result.tokens}/{result.budget} tokens", err=True)

    emit(result, as_json, render)


@context.command("eval")
@click.argument("repo", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--limit", default=50, show_default=True, type=click.IntRange(min=1), help="Commits to mine."
)
@json_option
def eval_cmd(repo: str, limit: int, as_json: bool) -> None:
    """Localization on REPO's own bug-fix commits: Acc@1, Acc@5 and MRR per ranking mode."""
    from hybrid.context.evaluation import evaluate

    with _progress("evaluating commits") as progress:
        report = evaluate(repo, limit, progress=progress)

    def render() -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{report.repo}: {report.cases} bug-fix commits")
        for col in ("ranking", "Acc@1", "Acc@5", "MRR"):
            table.add_column(col, justify="left" if col == "ranking" else "right")
        for mode, m in report.metrics.items():
            label: dict[str, Any] = {
                "full": "full (PPR + BM25, reranked by symbols)",
                "fused": "files only (PPR + BM25)",
                "bm25": "BM25 only",
                "graph": "graph only",
            }
            table.add_row(label[mode], f"{m.acc_at_1:.2f}", f"{m.acc_at_5:.2f}", f"{m.mrr:.3f}")
        console = Console()
        console.print(table)
        if not report.edit:
            return
        budgets = sorted(next(iter(report.edit.values())))
        edit = Table(title="edit-site recall: tasks with every hunk in a packed body (hunks)")
        edit.add_column("pack")
        for b in budgets:
            edit.add_column(f"{b // 1000}k" if b % 1000 == 0 else str(b), justify="right")
        for variant, per_budget in report.edit.items():
            cells = [
                f"{per_budget[b].task_recall:.2f} ({per_budget[b].hunk_recall:.2f})"
                for b in budgets
            ]
            edit.add_row(_VARIANT_LABELS.get(variant, variant), *cells)
        console.print(edit)

    emit(report, as_json, render)
