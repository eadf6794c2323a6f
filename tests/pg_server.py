"""A throwaway PostgreSQL server for tests: initdb in a temporary folder, started on a free
loopback port, stopped at the end. Uses Debian's postgresql package (``.ci/run`` installs it);
when no server can be started, the tests that need one are skipped with the reason.

Set TUNER_TEST_PG_URL to use an existing server instead.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile


class Unavailable(Exception):
    pass


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path:
        return path
    raise Unavailable(f"PostgreSQL's {name} not found (apt-get install postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _bin("initdb"), _bin("pg_ctl")
        self.dir = tempfile.mkdtemp(prefix="tuner-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.prefix: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root: use the postgres account
            if shutil.which("runuser") is None:
                raise Unavailable("running as root without runuser")
            try:
                import pwd

                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("no 'postgres' user to run the server as") from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        p = subprocess.run([*self.prefix, *args], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise Unavailable(f"{os.path.basename(args[0])} failed: {(p.stderr or p.stdout).strip()[-300:]}")

    def start(self) -> str:
        self._run(self.initdb, "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(self.pg_ctl, "-D", self.data, "-o", opts, "-l", os.path.join(self.dir, "log"),
                  "-w", "-t", "60", "start")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run(self.pg_ctl, "-D", self.data, "-m", "immediate", "stop")
        except Unavailable:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
