"""A real PostgreSQL for the tests of braid's store on PostgreSQL (``--store postgresql://...``).

:func:`postgres_bindir` finds the server's programs (``initdb``, ``pg_ctl``), installing Debian's
``postgresql`` package when they are missing and the process may (CI runs as root).
:func:`run_postgres` makes a throwaway cluster in a new temporary directory, starts it listening
on a Unix socket only (no TCP port to collide with anything), and stops it (fast shutdown) on exit;
its :class:`Postgres` makes a fresh database per test.

``initdb`` refuses to run as root. As root, the cluster belongs to Debian's ``postgres`` user
(the package creates it) and its programs run through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from tools.apt import apt_install


def _find_bindir() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def postgres_bindir() -> Path:
    """The directory of PostgreSQL's server programs; installs Debian's package first when there
    is none (as root only)."""
    found = _find_bindir()
    if found is None:
        apt_install("postgresql")
        found = _find_bindir()
        if found is None:
            raise RuntimeError("postgresql was installed but initdb was not found")
    return found


@attrs.frozen
class Postgres:
    """A running throwaway cluster; ``socket_dir`` is where its Unix socket is."""

    socket_dir: Path
    user: str
    _pg_ctl: Callable[..., None]

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut), as an outage would."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        self._pg_ctl("-w", "start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@/{database}?host={self.socket_dir}"

    def create_database(self) -> str:
        """A new empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def run_postgres() -> Iterator[Postgres]:
    """A new cluster, started; stopped and deleted on exit."""
    bindir = postgres_bindir()
    base = Path(tempfile.mkdtemp(prefix="braid-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    as_root = os.geteuid() == 0
    run_as: list[str] = []
    if as_root:
        owner = pwd.getpwnam("postgres")
        for path in (base, sock):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    user = "postgres" if as_root else pwd.getpwuid(os.geteuid()).pw_name
    os.chmod(base, 0o755)

    def run(*argv: str) -> None:
        done = subprocess.run([*run_as, *argv], capture_output=True, text=True, timeout=120, cwd=base)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")

    # trust: the socket's directory is the only way in; fsync off: a test cluster needs no durability.
    run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "--no-sync", "-E", "UTF8")
    options = f"-c listen_addresses='' -k {sock} -c fsync=off -c full_page_writes=off"

    def pg_ctl(*argv: str) -> None:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "server.log"), *argv)

    pg_ctl("-w", "start")
    try:
        yield Postgres(sock, user, pg_ctl)
    finally:
        try:
            pg_ctl("-m", "fast", "-w", "stop")
        except RuntimeError:
            pass  # stopped already (a test's outage)
        finally:
            shutil.rmtree(base, ignore_errors=True)


__all__ = ["Postgres", "postgres_bindir", "run_postgres"]
