"""An idle client connection outlives the clients' own pool expiry, so the client closes it first: a
request on a pooled connection never races the server closing it (httpx's expiry is 5 s, as uvicorn's
default keep-alive was, and a request sent as the server closed the connection got ECONNRESET)."""

from __future__ import annotations

import time

import httpx

from rag.api import Settings

CLIENT_EXPIRY_S = 5.0  # httpx's default keepalive_expiry, which the OpenAI SDK keeps


def _client_port(reply: httpx.Response) -> int:
    return int(reply.extensions["network_stream"].get_extra_info("client_addr")[1])


def _ports_across_an_idle_gap(url: str, idle_s: float) -> tuple[int, int]:
    """The client-side port of a request and of another after ``idle_s``; the same port: the same
    connection, kept open by the server."""
    ports = []
    with httpx.Client(base_url=url, limits=httpx.Limits(keepalive_expiry=60)) as http:
        for wait_s in (0.0, idle_s):
            time.sleep(wait_s)
            reply = http.get("/healthz")
            assert reply.status_code == 200
            ports.append(_client_port(reply))  # while the socket is open
    return ports[0], ports[1]


def test_an_idle_connection_outlives_the_clients_expiry(serve, engine):
    assert Settings().keep_alive_s > CLIENT_EXPIRY_S
    with serve(Settings(), engine=engine) as srv:
        before, after = _ports_across_an_idle_gap(srv.url, CLIENT_EXPIRY_S + 1)
    assert before == after


def test_keep_alive_is_a_setting(serve, engine):
    with serve(Settings(keep_alive_s=1), engine=engine) as srv:
        before, after = _ports_across_an_idle_gap(srv.url, 2.5)
    assert before != after  # the server closed the idle connection; the client opened another
