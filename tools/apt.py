"""Debian's packages for the tests' real parts (nginx, PostgreSQL): installed when missing.

CI runs as root on Debian and reaches the package registries; ``apt-get update`` runs once per
process however many packages the tests ask for. Anyone else gets an error that names the
command to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess

_updated = False


def apt_install(package: str) -> None:
    """``apt-get install -y package`` (after one ``apt-get update``); RuntimeError when this
    process may not install (not root, no apt-get) or apt-get fails."""
    global _updated
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"{package} is not installed and this user cannot install it: apt-get install -y {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = [] if _updated else [["apt-get", "update", "-q"]]
    steps.append(["apt-get", "install", "-y", "-q", package])
    for argv in steps:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        if argv[1] == "update":
            _updated = True


__all__ = ["apt_install"]
