"""What `ramen start` does on its way down when its supervisor had died: a successor supervisor
stops the workers it left, through the confserver; with the confserver gone (another site's,
stopped first) no successor could start, and the processes are left to be stopped by their token."""

from __future__ import annotations

import socket
import subprocess
from types import SimpleNamespace

from ramen.cli import start


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_supervisor(tmp_path):
    return SimpleNamespace(process=SimpleNamespace(returncode=-9), log_path=tmp_path / "supervisor.log")


def test_with_the_confserver_gone_no_successor_is_started(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a successor was started: {args}")
    monkeypatch.setattr(subprocess, "run", refuse)
    url = f"ramen://127.0.0.1:{closed_port()}"
    start._stop_left_over(dead_supervisor(tmp_path), {}, "core", url)
    assert capsys.readouterr().err == (f"ramen: the supervisor had died (status -9) and the confserver at {url} is "
                                       f"unreachable; stopping what it left running without it\n")


def test_with_the_confserver_there_a_successor_stops_what_was_left(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kwargs: started.append(argv))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = "ramen://127.0.0.1:%d" % listening.getsockname()[1]
        start._stop_left_over(dead_supervisor(tmp_path), {}, "core", url)
    assert [argv[1:] for argv in started] == [["-m", "supervisor.service", "--site", "core", "--stop-left-over"]]
    assert "stopping what it left running" in capsys.readouterr().err
