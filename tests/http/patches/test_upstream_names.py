"""Every private upstream name braid's patches rely on exists in the installed packages.

hypercorn, trio, h11, h2 and quart-trio are pinned exactly in pyproject.toml because the patches
(src/braid/http/patches/) reach into them. When an upgrade removes or renames one of those names,
this test fails with the name, the patch that relies on it and the new version, before a patch
silently stops applying or fails on a client's request.
"""

from __future__ import annotations

import re

import attrs
import hypercorn.protocol
import hypercorn.trio.run
import pytest
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio.tcp_server import TCPServer

from braid.http.patches import PATCHES, Patch, PatchOptions, UpstreamChanged, installed, missing_upstream_names
from braid.http.patches.client_close import PATCH as CLIENT_CLOSE
from braid.http.patches.patch import Upstream


@pytest.mark.parametrize("patch", PATCHES, ids=lambda patch: patch.name)
def test_every_name_a_patch_relies_on_exists(patch: Patch) -> None:
    missing = missing_upstream_names([patch])
    assert not missing, "\n".join(str(m) for m in missing)


def test_a_removed_name_is_reported_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: as if hypercorn had renamed ``TCPServer._read_data``."""
    monkeypatch.setattr(TCPServer, "_read_data_renamed", TCPServer._read_data, raising=False)
    monkeypatch.delattr(TCPServer, "_read_data")
    (missing,) = missing_upstream_names()
    assert str(missing.name) == "hypercorn.trio.tcp_server.TCPServer._read_data"
    assert missing.patch is CLIENT_CLOSE
    assert re.fullmatch(
        r"hypercorn\.trio\.tcp_server\.TCPServer\._read_data is gone: braid\.http\.patches\.client_close relies "
        r"on it; re-check the patch against the new [Hh]ypercorn \S+, or install the version pyproject\.toml pins",
        str(missing),
    ), str(missing)


class _Upgraded:
    """Stands for an upstream class after an upgrade renamed an attribute its instances get."""

    def __init__(self) -> None:
        self.renamed_lock: object = object()


def test_a_renamed_instance_attribute_or_a_moved_module_is_reported() -> None:
    patch = attrs.evolve(
        CLIENT_CLOSE,
        relies_on=(
            Upstream(__name__, "_Upgraded.send_lock", instance=True),
            Upstream(__name__, "_Upgraded.renamed_lock", instance=True),
            Upstream("h11._writers_moved", "ChunkedWriter"),
        ),
    )
    missing = missing_upstream_names([patch])
    assert [str(m.name) for m in missing] == [f"{__name__}._Upgraded.send_lock", "h11._writers_moved.ChunkedWriter"]
    assert str(missing[0]).startswith(f"{__name__}._Upgraded.send_lock (set on its instances) is gone:")


def test_the_installer_refuses_to_start_and_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(H2Protocol, "_handle_events")
    with pytest.raises(UpstreamChanged, match=r"hypercorn\.protocol\.h2\.H2Protocol\._handle_events is gone"):
        with installed():
            pass
    assert hypercorn.trio.run.TCPServer is TCPServer and hypercorn.protocol.H2Protocol is H2Protocol
    with installed(PatchOptions().without("h2_late_data")):  # off, its names do not matter
        assert hypercorn.trio.run.TCPServer is not TCPServer
