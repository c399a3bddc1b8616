"""``braid serve`` as a user runs it: a subprocess on loopback, the official openai client, SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from tools.servers import free_port


def _start(*args: str, stderr: int = subprocess.STDOUT) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``braid serve --engine scripted`` on a free port and wait until it is healthy."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "braid", "serve", "--engine", "scripted", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    raise AssertionError(f"braid serve did not start in 20 s: {out.decode(errors='replace')[-2000:]}")


@pytest.fixture(scope="module")
def braid_url() -> Iterator[str]:
    proc, url = _start("--token-delay", "0.001")
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_openai_client_list_prompts(braid_url: str) -> None:
    client = openai.OpenAI(base_url=braid_url + "/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model="scripted", prompt=["Hello", "World", "!"], max_tokens=5, seed=1)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert done.usage is not None and done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens

    stream = client.completions.create(
        model="scripted",
        prompt=["Hello", "World", "!"],
        max_tokens=5,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts: dict[int, str] = {}
    usage = []
    for chunk in stream:
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in done.choices}
    assert len(usage) == 1 and usage[0].completion_tokens == done.usage.completion_tokens


def test_openai_client_token_id_batch_and_errors(braid_url: str) -> None:
    client = openai.OpenAI(base_url=braid_url + "/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model="scripted", prompt=[[10, 11, 12], [13]], max_tokens=3, n=2, seed=5)
    assert [c.index for c in done.choices] == [0, 1, 2, 3]
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="scripted", prompt=[[1, 2], [3, -4]], max_tokens=3)
    assert "prompt[1][1]" in str(exc.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x")


def test_sigterm_drains_then_exits_cleanly() -> None:
    proc, url = _start("--token-delay", "0.01", "--graceful-timeout", "1")
    with httpx.Client(base_url=url, timeout=10) as client:
        with client.stream(
            "POST",
            "/v1/completions",
            json={"prompt": ["a", "b"], "max_tokens": 2000, "ignore_eos": True, "stream": True},
        ) as r:
            it = r.iter_raw()
            body = next(it)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            body += b"".join(it)
            cut_after = time.monotonic() - started
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    # the drain ends the stream with an error event a quarter second before its 1 s are up
    assert 0.6 <= cut_after <= 5, cut_after
    assert body.endswith(b"data: [DONE]\n\n") and b"shut down" in body, body[-300:]
    log = out.decode(errors="replace")
    assert "draining" in log and "ended 1 request(s)" in log and "Traceback" not in log, log


def test_curl_style_request(braid_url: str) -> None:
    r = httpx.post(
        braid_url + "/v1/completions",
        json={"model": "scripted", "prompt": ["Hello", "World"], "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_switch_interval_is_shortened_only_for_two_busy_threads() -> None:
    import sys

    from braid.cli.engines import set_switch_interval

    saved = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        set_switch_interval(None, two_threads=False)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        set_switch_interval(None, two_threads=True)
        assert sys.getswitchinterval() == pytest.approx(0.001)
        set_switch_interval(0.003, two_threads=True)
        assert sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        sys.setswitchinterval(saved)


def _exchange(url: str, data: bytes) -> bytes:
    """Send raw bytes, then read until braid closes the connection (at most 5 s)."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_the_read_limits_reach_the_server() -> None:
    proc, url = _start("--max-body-bytes", "1000", "--body-timeout", "0.5", "--max-header-bytes", "2048")
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": "x" * 1000}, timeout=10)
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]
        started = time.monotonic()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
        answer = _exchange(url, head + b"Content-Length: 100\r\n\r\n{")
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 3
        assert _exchange(url, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 3000).startswith(b"HTTP/1.1 431")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


@pytest.mark.parametrize(
    "flag",
    ["--heartbeat", "--stall-timeout", "--write-timeout", "--body-timeout", "--max-body-bytes", "--max-header-bytes"],
)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_periods_must_be_positive(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from braid.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", flag, value])
    assert "must be > 0" in capsys.readouterr().err


def test_settings_refuse_a_zero_heartbeat() -> None:
    from braid.settings import Settings

    with pytest.raises(ValueError):
        Settings(heartbeat=0)


def test_admission_flags_reach_the_server() -> None:
    """The admission flags end up in the app's Admission, and the reserve in the engine's room."""
    from braid.cli.config import settings_from
    from braid.cli.engines import extra_seqs
    from braid.cli.parser import build_parser
    from braid.engine.base import ModelInfo
    from braid.stream.admit import admission_for

    args = build_parser().parse_args(
        ["serve", "--max-in-flight-requests", "8", "--max-queued-requests", "3", "--admission-reserve", "2"]
    )
    settings = settings_from(args)
    adm = admission_for(settings, ModelInfo("m", "m", max_model_len=16, vocab_size=8, max_num_seqs=66, reserved_seqs=2))
    assert (adm.slots, adm.max_queued, adm.reserve) == (8, 3, 2)
    assert extra_seqs(2)(64) == 2 and extra_seqs(None)(64) == 4
    assert settings_from(build_parser().parse_args(["serve"])).max_in_flight is None  # the engine decides


@pytest.mark.parametrize(
    ("engine_arg", "named"),
    [
        ("max_num_queued_reqs=5", "--max-queued-requests"),
        ("max-num-queued-tokens=4096", "--max-in-flight-requests"),
        ("data_parallel_size=2", "rank 0"),
    ],
)
def test_engine_args_braid_would_not_honour_stop_it_before_any_engine(
    engine_arg: str, named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import braid.cli.main

    def started(args: object) -> None:
        raise AssertionError("an engine was started")

    monkeypatch.setattr(braid.cli.main, "open_engine", started)
    with pytest.raises(SystemExit) as exit_:
        braid.cli.main.main(["serve", "--engine", "vllm", "--engine-arg", engine_arg])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert engine_arg.split("=")[0].replace("-", "_") in err and named in err


@pytest.mark.parametrize(
    ("argv", "write_timeout"),
    [([], 30.0), (["--stall-timeout", "5"], 5.0), (["--stall-timeout", "5", "--write-timeout", "12"], 12.0)],
)
def test_the_write_timeout_follows_the_stall_timeout_unless_given(argv: list[str], write_timeout: float) -> None:
    from braid.cli.config import server_config_from
    from braid.cli.parser import build_parser

    cfg = server_config_from(build_parser().parse_args(["serve", *argv]))
    assert cfg.write_timeout == write_timeout


def test_connection_options_reach_theserver_config_from() -> None:
    from braid.cli.config import server_config_from
    from braid.cli.parser import build_parser

    assert server_config_from(build_parser().parse_args(["serve"])).backlog == 2048
    cfg = server_config_from(
        build_parser().parse_args(["serve", "--backlog", "512", "--stock-send", "--accept-batch", "1"])
    )
    assert cfg.backlog == 512 and cfg.fast_send is False and cfg.accept_batch == 1
    assert server_config_from(build_parser().parse_args(["serve"])).accept_batch == 64


def test_a_port_in_use_is_one_line_before_any_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import braid.cli.main

    monkeypatch.setattr(braid.cli.main, "open_engine", _no_engine)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert braid.cli.main.main(["serve", "--engine", "scripted", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_a_model_path_that_does_not_exist_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import braid.cli.main

    monkeypatch.setattr(braid.cli.main, "open_engine", _no_engine)
    assert braid.cli.main.main(["serve", "--engine", "vllm", "--port", "0", "--model", "/nonexistent/model"]) == 1
    err = capsys.readouterr().err
    assert err == "braid: no model at /nonexistent/model: no such file or directory\n"


def test_an_engine_that_fails_to_start_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from contextlib import asynccontextmanager

    import braid.cli.main

    @asynccontextmanager
    async def failing(args: object):  # type: ignore[no-untyped-def]
        async with trio.open_nursery():  # the error arrives wrapped in a group, as from vLLM's start
            raise RuntimeError("the engine core died\nwhile loading")
        yield

    monkeypatch.setattr(braid.cli.main, "open_engine", failing)
    assert braid.cli.main.main(["serve", "--engine", "scripted", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err == "braid: could not start: RuntimeError: the engine core died while loading\n"


@pytest.mark.vllm  # the parser registries are vLLM's
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--enable-auto-tool-choice", "--tool-call-parser", "hermez"], "--tool-call-parser 'hermez' is not one of"),
        (["--reasoning-parser", "qwen4"], "--reasoning-parser 'qwen4' is not one of"),
        (["--tool-call-parser", "hermes"], "--tool-call-parser needs --enable-auto-tool-choice"),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser"),
        (
            ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-parser-plugin", "/no/such.py"],
            "--tool-parser-plugin '/no/such.py': no such file or module",
        ),
    ],
)
def test_a_wrong_parser_flag_is_one_line_before_any_engine(
    flags: list[str], expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import braid.cli.main

    monkeypatch.setattr(braid.cli.main, "open_engine", _no_engine)
    assert braid.cli.main.main(["serve", "--engine", "scripted", "--port", "0", *flags]) == 1
    # vLLM's import logs its own lines first; braid's is one line
    (line,) = (ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("braid:"))
    assert line.startswith("braid: " + expected)
    if "not one of" in expected:
        assert "hermes" in line or "qwen3" in line  # the valid names are listed


def _no_engine(args: object) -> None:
    raise AssertionError("an engine was started")


def test_api_keys_from_flags_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--api-key, --api-key-file (comments and blanks skipped) and BRAID_API_KEY all admit a
    request on a real ``braid serve``; /health stays open; the keys never show in the settings' repr."""
    from braid.cli.config import settings_from
    from braid.cli.parser import build_parser

    key_file = tmp_path / "keys"
    key_file.write_text("# ops keys\n\n  file-key  \n#not-a-key\nfile-key-2\n")
    args = ["--api-key", "flag-key", "--api-key-file", str(key_file), "--metrics-public"]
    settings = settings_from(build_parser().parse_args(["serve", *args]), {"BRAID_API_KEY": "env-key"})
    assert settings.api_keys == ("flag-key", "file-key", "file-key-2", "env-key") and settings.metrics_public
    assert "key" not in repr(settings).replace("api_keys", "")
    assert settings_from(build_parser().parse_args(["serve"]), {}).api_keys == ()
    monkeypatch.setenv("BRAID_API_KEY", "env-key")
    proc, url = _start("--api-key-file", str(key_file), "--allowed-origins", "https://a.example")
    try:
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        assert (
            httpx.get(url + "/v1/models", headers={"Authorization": "Bearer not-a-key"}, timeout=10).status_code == 401
        )
        for key in ("file-key", "file-key-2", "env-key"):
            r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert r.status_code == 200, key
        assert httpx.get(url + "/metrics", timeout=10).status_code == 401  # not --metrics-public
        r = httpx.get(url + "/health", headers={"Origin": "https://a.example"}, timeout=10)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://a.example"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--api-key-file", "/nonexistent/keys"], {}, "cannot read"),
        (["--api-key-file", "EMPTY"], {}, "no keys in"),
        (["--api-key", "has space"], {}, "visible ASCII"),
        ([], {"BRAID_API_KEY": " "}, "BRAID_API_KEY is set but empty"),
    ],
)
def test_a_key_setting_that_would_leave_the_server_open_stops_it(
    argv: list[str],
    env: dict[str, str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from braid.cli import main as cli

    (tmp_path / "empty").write_text("# nothing\n\n")
    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in argv]
    monkeypatch.delenv("BRAID_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "open_engine", None)  # never reached
    with pytest.raises(SystemExit):
        cli.main(["serve", "--engine", "scripted", *argv])
    assert message in capsys.readouterr().err


def test_every_serve_option_can_come_from_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    from braid.cli.config import settings_from
    from braid.cli.parser import build_parser

    env = {
        "BRAID_PORT": "9123",
        "BRAID_MAX_QUEUED_REQUESTS": "7",
        "BRAID_METRICS_PUBLIC": "yes",
        "BRAID_ENGINE": "scripted",
        "BRAID_ALLOWED_ORIGINS": "https://a.example https://b.example",
    }
    args = build_parser(env).parse_args(["serve", "--max-queued-requests", "9"])
    assert (args.port, args.engine, args.metrics_public) == (9123, "scripted", True)
    assert args.allowed_origins == ["https://a.example", "https://b.example"]
    assert settings_from(args, {}).max_queued == 9  # the command line wins over the variable
    for bad in ({"BRAID_PORT": "eighty"}, {"BRAID_ENGINE": "tgi"}, {"BRAID_METRICS_PUBLIC": "maybe"}):
        with pytest.raises(SystemExit):
            build_parser(bad).parse_args(["serve"])
        assert next(iter(bad)) in capsys.readouterr().err


def test_help_shows_each_default_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    from braid.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for shown in (
        "(default: 8000; env BRAID_PORT)",
        "(default: 256; env BRAID_MAX_QUEUED_REQUESTS)",
        "(default: off; env BRAID_ACCESS_LOG)",
        "(default: text; env BRAID_LOG_FORMAT)",
        "(default: none; env BRAID_FORWARDED_ALLOW_IPS)",
    ):
        assert shown in out


def test_log_flags_and_their_variables(capsys: pytest.CaptureFixture[str]) -> None:
    from braid.cli.config import settings_from
    from braid.cli.parser import build_parser

    settings = settings_from(build_parser().parse_args(["serve"]), {})
    assert (settings.access_log, settings.forwarded_allow_ips) == (False, ())
    assert build_parser().parse_args(["serve"]).log_format == "text"
    args = build_parser().parse_args(
        ["serve", "--log-format", "json", "--access-log", "--forwarded-allow-ips", "10.0.0.1, 10.1.0.0/16,::1"]
    )
    settings = settings_from(args, {})
    assert args.log_format == "json" and settings.access_log
    assert settings.forwarded_allow_ips == ("10.0.0.1", "10.1.0.0/16", "::1")
    env = {"BRAID_LOG_FORMAT": "json", "BRAID_ACCESS_LOG": "true", "BRAID_FORWARDED_ALLOW_IPS": "*"}
    args = build_parser(env).parse_args(["serve"])
    assert (args.log_format, args.access_log, settings_from(args, {}).forwarded_allow_ips) == ("json", True, ("*",))
    assert build_parser(env).parse_args(["serve", "--log-format", "text"]).log_format == "text"
    for bad in ({"BRAID_LOG_FORMAT": "xml"}, {"BRAID_FORWARDED_ALLOW_IPS": "nginx.local"}):
        with pytest.raises(SystemExit):
            build_parser(bad).parse_args(["serve"])
        assert next(iter(bad)) in capsys.readouterr().err
    for argv in (["--log-format", "xml"], ["--forwarded-allow-ips", "10.0.0.0/33"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *argv])
        assert argv[0] in capsys.readouterr().err


def test_json_logs_from_braid_serve() -> None:
    """``--log-format json --access-log``: access lines on stdout, every other record on stderr,
    each line one JSON object; the remote address is the forwarded client's for an allowed peer;
    hypercorn's records come once, in braid's format."""
    proc, url = _start(
        "--log-format", "json", "--access-log", "--forwarded-allow-ips", "127.0.0.1", stderr=subprocess.PIPE
    )
    try:
        r = httpx.get(url + "/v1/models", headers={"X-Forwarded-For": "198.51.100.7", "X-Request-Id": "ops-1"})
        assert r.status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    access = [json.loads(line) for line in out.decode().splitlines()]
    records = [json.loads(line) for line in err.decode().splitlines()]
    assert {a["logger"] for a in access} == {"braid.access"}
    models = [a for a in access if a["path"] == "/v1/models"]
    assert len(models) == 1 and models[0]["remote"] == "198.51.100.7" and models[0]["request_id"] == "ops-1"
    assert all(a["remote"] == "127.0.0.1" for a in access if a["path"] == "/health")  # the readiness polls
    assert all(set(rec) == {"time", "level", "logger", "message"} for rec in records), records
    assert [rec["logger"] for rec in records if "Running on" in rec["message"]] == ["hypercorn.error"]
    assert any(rec["logger"] == "braid" and "draining" in rec["message"] for rec in records)


def test_openai_client_chat(braid_url: str) -> None:
    client = openai.OpenAI(base_url=braid_url + "/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    # min_tokens: no choice may end at once with EOS (the check below wants text in each)
    done = client.chat.completions.create(
        model="scripted", messages=messages, max_tokens=6, seed=2, n=2, extra_body={"min_tokens": 2}
    )
    assert [c.index for c in done.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.message.content for c in done.choices)
    assert done.usage is not None and done.usage.completion_tokens > 0

    stream = client.chat.completions.create(
        model="scripted",
        messages=messages,
        max_tokens=6,
        seed=2,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 2},
    )
    texts: dict[int, str] = {}
    roles: dict[int, str] = {}
    usage = []
    for chunk in stream:
        if chunk.usage is not None:
            usage.append(chunk.usage)
        for c in chunk.choices:
            if c.delta.role:
                roles[c.index] = c.delta.role
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {c.index: c.message.content for c in done.choices}
    assert len(usage) == 1 and usage[0].completion_tokens == done.usage.completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="scripted", messages=[], max_tokens=2)
