"""An exec started ahead of its command: a pooled sandbox's first command skips ``runc exec``.

Starting an exec is most of what running a short command in a warm container costs: the engine
asks the runtime to enter the container (``runc exec`` or ``runsc exec``) and only then does the
command start. A slot pays that before the job exists. The pool opens one in each sandbox it
makes: an exec of ``/bin/sh`` that waits on its attached stdin for one line, the job, then
``exec``s the same watchdog an ordinary exec runs, so from there on it *is* that exec (same
process tree, same exit code through ``exec_inspect``, same deadline, supervisor and backstop).

The line is built here from the job's argv, environment and working directory, every word
single-quoted (a newline inside a value becomes ``"$nl"``, so the job is always one line). The
job's stdin is /dev/null, as an exec without stdin has. A slot is used once; closing it unused
ends its shell (end of input) and nothing runs.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from dataclasses import dataclass, field

from hybrid.workstation.docker.engine import _stream_client, client
from hybrid.workstation.docker.supervision import _WATCHDOG, _ExecStream, watchdog_words

# $1 is the watchdog script; the job line ends in `exec /bin/sh -c "$1" ...`.
_LAUNCHER = "nl='\n'; IFS= read -r job || exit 0; eval \"$job\""


@dataclass
class Slot:
    """One started exec waiting for its job, and the connection to its stdin and output."""

    exec_id: str
    sock: socket.socket
    stream: _ExecStream | None = field(default=None, repr=False)

    def waiting(self) -> bool:
        """True while the shell still waits: nothing has arrived on the connection (a shell
        that ended, with its container or by a kill, has the engine close it)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def start(
        self, argv: list[str], env: dict[str, str], workdir: str, deadline: float
    ) -> tuple[_ExecStream, float]:
        """Send the job; its output stream and the epoch time it was sent (its start)."""
        started = time.time()
        words = watchdog_words(deadline, started, argv)
        exports = "".join(f"export {name}={_quote(value)}; " for name, value in env.items())
        line = (
            f"cd {_quote(workdir)} || exit 126; {exports}"
            f'exec /bin/sh -c "$1" hybrid-watchdog {" ".join(map(_quote, words))} </dev/null\n'
        )
        self.sock.sendall(line.encode())
        self.stream = _ExecStream.over(self.sock)
        return self.stream, started

    def close(self) -> None:
        """Drop the connection (an unused slot's shell reads end of input and exits)."""
        if self.stream is not None:
            self.stream.close()
        with contextlib.suppress(OSError):
            self.sock.close()


def open_slot(container: str, user: str, env: dict[str, str], workdir: str) -> Slot:
    """Start a waiting exec in ``container`` (running as ``user``, the environment ``env``)."""
    api = client().api
    exec_id = str(
        api.exec_create(
            container,
            ["/bin/sh", "-c", _LAUNCHER, "hybrid-slot", _WATCHDOG],
            stdin=True,
            environment=env,
            workdir=workdir,
            user=user,
        )["Id"]
    )
    response = _ExecStream.post_start(_stream_client(), exec_id)
    # The shell has printed nothing (it waits for its line), so the response's reader holds
    # nothing past the headers: the socket alone carries the rest.
    sock = _ExecStream.socket_of(response).dup()
    response.close()
    return Slot(exec_id, sock)


def _quote(word: str) -> str:
    """``word`` as one shell word on one line."""
    return "'" + word.replace("'", "'\\''").replace("\n", "'\"$nl\"'") + "'"


__all__ = ["Slot", "open_slot"]
