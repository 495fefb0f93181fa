"""How an informer lists (connectors.kubernetes.informer): a streaming list where the API
server offers one, pages where it does not. The real API server (tests/k8s) offers it,
so the fallbacks are shown here against a scripted server: an ``_request`` that answers
as an API server without the feature would."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from connectors.kubernetes.informer import INITIAL_EVENTS_END, Informer


class Response:
    """What ``_request`` returns: a whole body (a page) or a stream of events."""

    def __init__(self, body: Any = None, events: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(body).encode() if body is not None else b""
        self.events = events or []

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        for event in self.events:
            yield json.dumps(event).encode() + b"\n"

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def pod(name: str, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": version,
            "managedFields": [{"manager": "kubelet"}],
        }
    }


def added(name: str) -> dict[str, Any]:
    return {"type": "ADDED", "object": pod(name)}


def end_of_initial_events(version: str) -> dict[str, Any]:
    return {
        "type": "BOOKMARK",
        "object": {
            "metadata": {
                "resourceVersion": version,
                "annotations": {INITIAL_EVENTS_END: "true"},
            }
        },
    }


class ScriptedServer:
    """Answers the informer's requests in turn from a script; records the queries."""

    def __init__(self, answers: list[Response | ApiException]) -> None:
        self.answers = answers
        self.queries: list[dict[str, str]] = []

    def __call__(self, query: list[tuple[str, str]], *, timeout: Any) -> Response:
        self.queries.append(dict(query))
        if not self.answers:
            raise ApiException(status=503, reason="script over")
        answer = self.answers.pop(0)
        if isinstance(answer, ApiException):
            raise answer
        return answer


def informer_on(server: ScriptedServer) -> Informer:
    informer = Informer(api=None, path="/api/v1/pods", name="pods")  # type: ignore[arg-type]
    informer._request = server  # type: ignore[method-assign]
    return informer


def run_until_listed(informer: Informer, server: ScriptedServer) -> None:
    """The informer's loop in this thread, until the script runs out (its 503) after a
    list, then stopped."""

    def stop_after_list(delay: float) -> bool:
        informer._stop.set()
        return True

    informer._stop.wait = stop_after_list  # type: ignore[method-assign]
    informer._run()


def test_a_streaming_list_fills_the_cache_and_the_same_stream_goes_on_as_the_watch() -> None:
    server = ScriptedServer(
        [
            Response(
                events=[
                    added("a"),
                    added("b"),
                    end_of_initial_events("10"),
                    {"type": "MODIFIED", "object": pod("a", "11")},
                    {"type": "DELETED", "object": pod("b", "12")},
                ]
            )
        ]
    )
    informer = informer_on(server)
    run_until_listed(informer, server)
    assert informer.lists == 1 and informer.stream_list and informer.synced is False
    assert [obj["metadata"]["name"] for obj in informer.items()] == ["a"]
    assert informer.get("ns", "a")["metadata"]["resourceVersion"] == "11"  # type: ignore[index]
    assert "managedFields" not in informer.get("ns", "a")["metadata"]  # type: ignore[index]
    assert informer.resource_version == "12"
    first, watch = server.queries[:2]
    assert first["sendInitialEvents"] == "true" and first["resourceVersionMatch"] == "NotOlderThan"
    # When the stream ended the watch resumed from where it stood, without listing again.
    assert watch.get("resourceVersion") == "12" and "sendInitialEvents" not in watch


@pytest.mark.parametrize(
    ("refusal", "streams_later"),
    [
        (ApiException(status=422, reason="sendInitialEvents is forbidden"), False),
        # A server that ignores sendInitialEvents: a plain watch's events, or bookmarks
        # without the annotation, before any end of initial events.
        (Response(events=[added("a"), {"type": "MODIFIED", "object": pod("a", "2")}]), False),
        (Response(events=[added("a"), {"type": "BOOKMARK", "object": pod("a", "2")}]), False),
        # A stream that ends early (a server shutting down, a list longer than the
        # watch's timeout) says nothing of the server: this list goes by pages, the next
        # streams again.
        (Response(events=[added("a"), added("b")]), True),
    ],
    ids=["refused", "plain-watch-events", "plain-bookmark", "ended-early"],
)
def test_a_streaming_list_that_fails_is_listed_in_pages(
    refusal: Response | ApiException, streams_later: bool
) -> None:
    pages = [
        Response(body={"items": [pod("a")], "metadata": {"continue": "next"}}),
        Response(body={"items": [pod("b")], "metadata": {"resourceVersion": "7"}}),
    ]
    server = ScriptedServer([refusal, *pages])
    informer = informer_on(server)
    run_until_listed(informer, server)
    assert informer.stream_list is streams_later and informer.lists == 1
    assert sorted(obj["metadata"]["name"] for obj in informer.items()) == ["a", "b"]
    assert informer.resource_version == "7"
    assert [q.get("limit") for q in server.queries[1:3]] == ["500", "500"]
    assert server.queries[2]["continue"] == "next"
