"""run/httpd.url belongs to the instance's page: a second httpd neither takes it from a live one
nor removes it when it stops."""

import socket

import pytest

from ramen.httpd.service import claim_url_file, release_url_file, url_file


@pytest.fixture
def ramen_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RAMEN_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def listening():
    """The URL of a socket that accepts connections on 127.0.0.1 (the first httpd)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"http://127.0.0.1:{server.getsockname()[1]}/"


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/"


def test_the_first_httpd_writes_its_url_and_removes_it_when_it_stops(ramen_dir):
    url = closed_port_url()
    assert claim_url_file(url)
    assert url_file().read_text() == url + "\n"
    release_url_file(url)
    assert not url_file().exists()


def test_a_second_httpd_leaves_the_url_of_one_that_answers(ramen_dir, listening):
    assert claim_url_file(listening)
    second = closed_port_url()
    assert not claim_url_file(second)
    release_url_file(second)  # what the second's stop does: nothing, the file is not its own
    assert url_file().read_text().strip() == listening


def test_the_url_of_an_httpd_gone_without_removing_it_is_taken(ramen_dir):
    gone = closed_port_url()  # killed: its file stayed, nothing listens there any more
    url_file().parent.mkdir(parents=True)
    url_file().write_text(gone + "\n")
    mine = closed_port_url()
    assert claim_url_file(mine)
    assert url_file().read_text().strip() == mine


def test_a_restarted_httpd_on_the_same_address_takes_its_url_again(ramen_dir, listening):
    url_file().parent.mkdir(parents=True)
    url_file().write_text(listening + "\n")  # left by the one before it, on the port it listens on now
    assert claim_url_file(listening)
    release_url_file(listening)
    assert not url_file().exists()
