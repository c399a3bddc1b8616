"""A ``multipart/form-data`` body as it arrives: small fields kept, the one file part streamed.

:class:`FormReader` wraps werkzeug's sans-I/O decoder (the parser quart's own form parsing
uses) and does no I/O: it is fed body chunks and hands back what each chunk completed, so the
caller writes the file part where it wants while the body arrives and holds none of it. Its
bounds: a field's value at most :data:`MAX_FIELD_BYTES`, at most :data:`MAX_PARTS` parts, one
file part; past them, :class:`~braid.errors.InvalidRequest`.
"""

from __future__ import annotations

import attrs
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, NeedData

from braid.errors import InvalidRequest, SchemaError

MAX_FIELD_BYTES = 4096
MAX_PARTS = 16
FEED_BYTES = 64 * 1024
"""The decoder is fed at most this much at once, so that its buffer stays small."""


@attrs.frozen
class FileStart:
    """The file part begins: the client's file name for it (never a path to braid)."""

    field: str
    filename: str


@attrs.frozen
class FileData:
    data: bytes


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` body; a 400 for any other content type."""
    mimetype, options = parse_options_header(content_type or "")
    if mimetype.lower() != "multipart/form-data" or not options.get("boundary"):
        raise SchemaError("Unsupported Media Type: the upload must be multipart/form-data with a boundary.")
    return options["boundary"].encode("latin-1")


@attrs.define
class FormReader:
    """Feed it the body (:meth:`feed`, then :meth:`end`); read ``fields`` when it has ended."""

    boundary: bytes
    fields: dict[str, str] = attrs.Factory(dict)
    _decoder: MultipartDecoder = attrs.field(init=False)
    _field: str | None = None
    _value: bytearray = attrs.Factory(bytearray)
    _in_file: bool = False
    _files: int = 0
    _parts: int = 0
    ended: bool = False

    def __attrs_post_init__(self) -> None:
        self._decoder = MultipartDecoder(self.boundary, max_form_memory_size=4 * FEED_BYTES)

    def feed(self, chunk: bytes) -> list[FileStart | FileData]:
        """What ``chunk`` completes of the file part, in order."""
        out: list[FileStart | FileData] = []
        for at in range(0, len(chunk), FEED_BYTES):
            self._receive(chunk[at : at + FEED_BYTES], out)
        return out

    def end(self) -> list[FileStart | FileData]:
        """The body has all arrived: what is left; a 400 if the form did not end properly."""
        out: list[FileStart | FileData] = []
        self._receive(None, out)
        if not self.ended:
            raise InvalidRequest("The multipart body ended before its closing boundary.")
        return out

    def _receive(self, data: bytes | None, out: list[FileStart | FileData]) -> None:
        if self.ended:
            return  # after the closing boundary: an epilogue, which means nothing
        try:
            self._decoder.receive_data(data)
            while not self.ended:
                event = self._decoder.next_event()
                if isinstance(event, NeedData):
                    return
                self._handle(event, out)
        except RequestEntityTooLarge:
            raise InvalidRequest("A multipart part header is too large.") from None
        except ValueError as exc:
            raise InvalidRequest(f"The multipart body is malformed: {exc}") from None

    def _handle(self, event: object, out: list[FileStart | FileData]) -> None:
        if isinstance(event, Field | File):
            self._parts += 1
            if self._parts > MAX_PARTS:
                raise InvalidRequest(f"The form has more than {MAX_PARTS} parts.")
        if isinstance(event, Field):
            self._field, self._in_file = event.name, False
            self._value.clear()
        elif isinstance(event, File):
            self._files += 1
            if self._files > 1:
                raise InvalidRequest("Upload one file per request.", param=event.name)
            self._field, self._in_file = None, True
            out.append(FileStart(event.name, event.filename))
        elif isinstance(event, Data):
            if self._in_file:
                if event.data:
                    out.append(FileData(event.data))
            elif self._field is not None:
                self._value += event.data
                if len(self._value) > MAX_FIELD_BYTES:
                    raise InvalidRequest(f"The form field {self._field!r} is too long.", param=self._field)
                if not event.more_data:
                    try:
                        self.fields[self._field] = self._value.decode()
                    except UnicodeDecodeError:
                        raise InvalidRequest(f"The form field {self._field!r} is not UTF-8.") from None
        elif isinstance(event, Epilogue):
            self.ended = True


__all__ = ["FileData", "FileStart", "FormReader", "boundary_of"]
