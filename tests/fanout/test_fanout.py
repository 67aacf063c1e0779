"""Fan-out on a real local Ray cluster: a head and a second node, each a `ray start` process.

The cluster runs this checkout (PYTHONPATH) and the test session's cache and state directories,
so its python-wasm guest is the one the session built.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from hybrid.errors import ContextError, ExecTimeout, PolicyViolation
from hybrid.fanout import (
    FanOutReport,
    LocalizationJob,
    PythonJob,
    WorkstationJob,
    disconnect,
    fan_out,
)
from hybrid.policy import NetworkPolicy, SandboxSpec
from hybrid.raylocal import LocalCluster

REPO = Path(__file__).resolve().parent.parent.parent


def _cluster(home: Path | None = None) -> LocalCluster:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return LocalCluster(
        nodes=2, cpus=1, env={"PYTHONPATH": path, **({"HOME": str(home)} if home else {})}
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with _cluster() as made:
        yield made
        disconnect()


def _leftovers(cluster: LocalCluster) -> list[int]:
    return sorted(cluster._mine())


def test_errors_survive_pickling() -> None:
    """What a node raises comes back to the caller as the same error, with its fields."""
    refused = pickle.loads(pickle.dumps(PolicyViolation(["network: no", "budget: no"])))
    assert refused.violations == ["network: no", "budget: no"]
    assert refused.message == "policy refused: network: no; budget: no"
    timeout = pickle.loads(pickle.dumps(ExecTimeout("too slow", result={"x": 1})))
    assert isinstance(timeout, TimeoutError) and timeout.result == {"x": 1}
    assert timeout.message == "too slow"
    plain = pickle.loads(pickle.dumps(ContextError("no files")))
    assert plain.message == "no files" and plain.exit_code == 7


def test_models_travel_and_keys_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation's model goes to the nodes; an endpoint's key is read there, never sent."""
    from hybrid.agent.models import OpenAIModel, ScriptedModel

    scripted = ScriptedModel(["a", "b"], name="s")
    scripted.complete([])
    copy = pickle.loads(pickle.dumps(scripted))
    assert copy.complete([]).text == "b" and copy.name == "s"
    monkeypatch.setenv("HYBRID_TEST_KEY", "sk-do-not-send-4f2a")
    endpoint = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key_env="HYBRID_TEST_KEY")
    sent = pickle.dumps(endpoint)
    assert b"sk-do-not-send-4f2a" not in sent
    rebuilt = pickle.loads(sent)
    assert rebuilt.name == "m" and rebuilt.base_url == endpoint.base_url


@pytest.mark.parametrize(("address", "code"), [("127.0.0.9:1", 5), ("nonsense", 2)])
def test_no_cluster_there_is_one_line_at_once(address: str, code: int) -> None:
    problems = str(REPO / "tests" / "agent" / "data" / "humaneval-sample.jsonl")
    done = subprocess.run(
        [sys.executable, "-m", "hybrid", "eval", problems, "--builtin", "oracle", "--ray", address],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,  # Ray's own client would retry a dead address for minutes
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and address in done.stderr, done.stderr


def test_results_come_back_in_order_from_both_nodes(cluster: LocalCluster) -> None:
    report = FanOutReport()
    jobs = [PythonJob(source=f"print({i} * {i})", tests=f"assert {i} >= 0") for i in range(60)]
    results = list(fan_out(jobs, cluster.address, chunk=3, report=report))
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(60)]
    assert all(r.ok and r.tier == "python-wasm" for r in results)
    assert report.chunks == 20 and report.retried == 0
    assert len(report.nodes) == 2, report  # SPREAD put chunks on both nodes


def test_a_jobs_own_error_is_raised_as_itself(cluster: LocalCluster, tmp_path: Path) -> None:
    egress = SandboxSpec(
        tier="python-wasm", network=NetworkPolicy(mode="egress", allow=["example.com"])
    )
    with pytest.raises(PolicyViolation, match="has no network") as refused:
        list(fan_out([PythonJob(source="pass", spec=egress)], cluster.address))
    assert all(len(v) > 1 for v in refused.value.violations)
    with pytest.raises(ContextError):
        list(fan_out([LocalizationJob(repo=tmp_path)], cluster.address))


@pytest.mark.engine
def test_workstation_jobs_run_on_the_nodes_engine(engine: Any, cluster: LocalCluster) -> None:
    jobs = [WorkstationJob(command=f"echo job {i}") for i in range(2)]
    results = list(fan_out(jobs, cluster.address, chunk=1))
    assert [r.stdout for r in results] == ["job 0\n", "job 1\n"]
    assert {r.tier for r in results} == {"docker"}


def test_eval_on_ray_scores_as_in_process(cluster: LocalCluster) -> None:
    """`hybrid eval --ray`: the same pass@k and steps as in process, runs spread over the nodes."""
    from click.testing import CliRunner

    from hybrid.cli import cli

    problems = str(REPO / "tests" / "agent" / "data" / "humaneval-sample.jsonl")
    args = ["eval", problems, "--builtin", "wrong-then-right", "-n", "2", "--pass-at", "2"]
    local = CliRunner().invoke(cli, [*args, "--json", "-q"])
    spread = CliRunner().invoke(cli, [*args, "--json", "-q", "--ray", cluster.address])
    assert local.exit_code == 0 and spread.exit_code == 0, spread.output
    one, other = json.loads(local.output), json.loads(spread.output)
    assert one["pass_at"] == other["pass_at"] == {"2": 1.0}
    assert one["results"] == other["results"]
    assert other["solved_at_step"] == {"2": other["problems"] * 2}


def test_a_killed_nodes_jobs_are_retried_elsewhere(tmp_path: Path) -> None:
    disconnect()  # this test's own cluster: it kills a node
    # ... whose nodes also find a ~/.ray/auth_token (any local ray.init writes one): the second
    # node must still join the head.
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)
    with _cluster(home=tmp_path) as cluster:
        try:
            report = FanOutReport()
            jobs = [PythonJob(source=f"import time\ntime.sleep(1)\nprint({i})") for i in range(24)]
            results, killed = [], False
            for result in fan_out(jobs, cluster.address, chunk=1, window=4, report=report):
                results.append(result)
                # Once the second node has run a job, kill it while it runs the next one.
                if not killed and len(report.nodes) == 2 and cluster.running(1):
                    cluster.kill_node(1)
                    killed = True
            assert killed, report
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
            assert report.retried >= 1, report
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
            assert len(alive) == 1
        finally:
            disconnect()
    assert not _leftovers(cluster)


TRAP_AFTER_CONNECT = """
import sys, wasmtime
from hybrid import fanout

def trap():
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    module = wasmtime.Module(engine, '(module (func (export "f") unreachable))')
    try:
        wasmtime.Instance(store, module, []).exports(store)["f"](store)
    except wasmtime.Trap:
        print("trapped", flush=True)

trap()  # wasmtime's fault handlers are in place before Ray's arrive
fanout.connect(sys.argv[1])
trap()
fanout.disconnect()
trap()
"""


def test_connecting_to_ray_keeps_the_in_process_wasm_tier_alive(cluster: LocalCluster) -> None:
    """ray.init installs crash handlers over wasmtime's: a wasm trap after connecting killed
    the whole process with SIGILL (the CI suite died at the wasm memory bomb). In a child
    process, so a regression fails this test instead of ending the suite."""
    done = subprocess.run(
        [sys.executable, "-c", TRAP_AFTER_CONNECT, cluster.address],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "trapped\ntrapped\ntrapped\n"
