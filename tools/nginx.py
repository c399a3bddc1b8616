"""A real nginx in front of braid replicas, for the deployment tests (tests/deploy).

:func:`nginx_binary` finds nginx, installing Debian's package when it is missing and the process
may (CI runs as root); :func:`render_site` turns docs/nginx.conf, the configuration docs/deploy.md
gives operators, into one for a test: its upstream servers, listen port and the timeouts it
names are replaced, nothing else, so the test runs the configuration the document shows.
:func:`run_nginx` runs it in the foreground under a throwaway prefix and stops it on exit.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx

from tools.apt import apt_install
from tools.servers import stop

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "docs" / "nginx.conf"


def nginx_binary() -> str:
    """The nginx executable; installs Debian's package first when there is none (as root only)."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if found:
        return found
    apt_install("nginx")
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(found, os.X_OK):
        raise RuntimeError("nginx was installed but is not on PATH")
    return found


def render_site(upstreams: Sequence[int], listen: int, timeouts: Mapping[str, str] | None = None) -> str:
    """docs/nginx.conf for replicas on these loopback ports, listening on ``listen``.

    ``timeouts`` maps a directive the file sets (``keepalive_timeout``, ``proxy_read_timeout``,
    ...) to the value a test wants; each must be in the file exactly once.
    """
    text = SITE.read_text()
    block = re.search(r"^(\s*)server 127\.0\.0\.1:\d+( [^\n]*)?;\n(?:\s*server 127\.0\.0\.1:\d+[^\n]*;\n)*", text, re.M)
    if block is None:
        raise AssertionError(f"{SITE}: no upstream server lines")
    indent, options = block.group(1), block.group(2) or ""
    lines = "".join(f"{indent}server 127.0.0.1:{port}{options};\n" for port in upstreams)
    text = text[: block.start()] + lines + text[block.end() :]
    text, count = re.subn(r"^(\s*)listen 80;$", rf"\g<1>listen 127.0.0.1:{listen};", text, flags=re.M)
    if count != 1:
        raise AssertionError(f"{SITE}: expected one 'listen 80;'")
    for name, value in (timeouts or {}).items():
        text, count = re.subn(rf"^(\s*){name} \S+;$", rf"\g<1>{name} {value};", text, flags=re.M)
        if count != 1:
            raise AssertionError(f"{SITE}: expected {name} once, found {count}")
    return text


def _main_conf(prefix: Path, site: Path) -> str:
    # As root the workers would drop to "nobody", who cannot write the test's temp directories.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}daemon off;\nworker_processes 1;\npid {prefix}/nginx.pid;\nerror_log {prefix}/error.log info;\n"
        "events { worker_connections 1024; }\n"
        "http {\n"
        f"    access_log {prefix}/access.log;\n"
        f"    client_body_temp_path {prefix}/body;\n    proxy_temp_path {prefix}/proxy;\n"
        f"    fastcgi_temp_path {prefix}/fastcgi;\n    uwsgi_temp_path {prefix}/uwsgi;\n"
        f"    scgi_temp_path {prefix}/scgi;\n"
        f"    include {site};\n"
        "}\n"
    )


@attrs.frozen
class Nginx:
    url: str
    prefix: Path
    proc: subprocess.Popen[bytes]

    def error_log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")


@contextmanager
def run_nginx(site_text: str, listen: int, prefix: Path) -> Iterator[Nginx]:
    """nginx in the foreground with ``site_text`` as its only site; stopped (SIGQUIT, then kill) on exit."""
    binary = nginx_binary()
    prefix.mkdir(parents=True, exist_ok=True)
    site = prefix / "site.conf"
    site.write_text(site_text)
    conf = prefix / "nginx.conf"
    conf.write_text(_main_conf(prefix, site))
    check = subprocess.run([binary, "-t", "-p", str(prefix), "-c", str(conf)], capture_output=True, text=True)
    if check.returncode != 0:
        raise RuntimeError(f"nginx -t refused the configuration:\n{check.stderr}")
    with open(prefix / "stderr.log", "wb") as out:
        proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{listen}"
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {proc.returncode}: {(prefix / 'error.log').read_text()[-2000:]}")
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx did not listen within 10 s") from None
                time.sleep(0.05)
        yield Nginx(url, prefix, proc)
    finally:
        stop(proc, signal.SIGQUIT, 5)  # nginx's graceful stop


__all__ = ["Nginx", "nginx_binary", "render_site", "run_nginx"]
