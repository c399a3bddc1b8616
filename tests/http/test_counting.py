"""The ``route`` label of ``braid_http_responses_total`` (braid.http.counting)."""

from __future__ import annotations

import pytest

from braid.http.counting import RouteLabels

LABELS = RouteLabels(frozenset({"/v1/completions", "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content"}))


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/completions", "/v1/completions"),
        ("/v1/files", "/v1/files"),
        ("/v1/files/file-abc", "/v1/files/{file_id}"),
        ("/v1/files/file-abc/content", "/v1/files/{file_id}/content"),
        # an empty id, a longer path, a near miss: not a route, so a client cannot add labels
        ("/v1/files/", "other"),
        ("/v1/files/a/b", "other"),
        ("/v1/files/a/contents", "other"),
        ("/v1/completion", "other"),
        ("/", "other"),
    ],
)
def test_a_path_is_labelled_by_its_route(path: str, label: str) -> None:
    assert LABELS(path) == label
