"""A slot (hybrid/workstation/docker/slot.py): an exec started ahead runs the next command as an
ordinary exec would (argv, environment, directory, exit code, deadline), falls back to an
ordinary exec when its shell is gone, and runs nothing when it is closed unused."""

from __future__ import annotations

import time

import pytest
from poll_kit import wait_for

from hybrid.policy import Environment, SandboxSpec
from hybrid.results import Termination
from hybrid.workstation.docker import client
from hybrid.workstation.docker.slot import Slot

pytestmark = pytest.mark.engine


def _slot(ws) -> Slot:  # type: ignore[no-untyped-def]
    slot = ws.open_slot()
    ws.take_slot(slot)
    return slot


def test_the_command_runs_in_the_slot_exactly_as_an_exec_would(engine, tier, make_spec):
    spec: SandboxSpec = make_spec(tier).model_copy(update={"env": Environment(allow=["ODD"])})
    odd = 'it\'s a\nnew line, $HOME, `id`, "quoted" \\ end'
    script = 'printf "%s|%s|%s" "$PWD" "$ODD" "$#"; printf x >&2; exit 7'
    with engine.create(spec) as ws:
        ws.exec(["mkdir", "sub"])
        plain = ws.exec(
            ["sh", "-c", script, "s", "arg one", "two"], env={"ODD": odd}, workdir="sub"
        )
        slot = _slot(ws)
        slotted = ws.exec(
            ["sh", "-c", script, "s", "arg one", "two"], env={"ODD": odd}, workdir="sub"
        )
        # The slot's own exec ran it (no other exec was made for it) and holds its exit code.
        assert client().api.exec_inspect(slot.exec_id)["ExitCode"] == 7
    assert plain.stdout == f"/workspace/sub|{odd}|2", plain
    for result in (plain, slotted):
        assert (result.exit_code, result.termination) == (7, Termination.NONZERO_EXIT), result
        assert (result.stdout, result.stderr) == (plain.stdout, "x")


def test_a_slotted_command_keeps_its_deadline(ws):
    _slot(ws)
    started = time.monotonic()
    result = ws.exec(["sh", "-c", "echo begun; sleep 60"], timeout=1.5)
    assert result.termination is Termination.TIMEOUT, result
    assert result.stdout == "begun\n"
    assert time.monotonic() - started < 20
    assert ws.exec(["echo", "after"]).stdout == "after\n"  # the sandbox still serves


def test_a_slot_whose_shell_was_killed_gives_way_to_an_exec(ws):
    slot = _slot(ws)
    api = client().api
    # From inside, by an exec of its own (ws.exec would hand it to the slot): the quotes keep
    # this command's own argv from matching.
    kill = 'for p in /proc/[0-9]*; do case "$(tr "\\0" " " < $p/cmdline)" in *hybrid-sl""ot*) kill -9 ${p#/proc/};; esac; done 2>/dev/null; true'
    killer = api.exec_create(ws.id, ["sh", "-c", kill], user=ws.user)["Id"]
    api.exec_start(killer)
    assert wait_for(lambda: not slot.waiting(), 30, 0.05), (
        "the engine kept the dead shell's stream open"
    )
    result = ws.exec(["echo", "ran"])
    assert (result.termination, result.stdout) == (Termination.OK, "ran\n"), result


def test_a_slot_closed_unused_runs_nothing(ws):
    slot = _slot(ws)
    ws.drop_slot()
    api = client().api
    assert wait_for(lambda: not api.exec_inspect(slot.exec_id)["Running"], 30, 0.05)
    assert api.exec_inspect(slot.exec_id)["ExitCode"] == 0
    assert ws.exec(["echo", "ran"]).stdout == "ran\n"
