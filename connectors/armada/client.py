"""Armada's gRPC API through armada-client, with its failures as ConnectorError.

One channel per connector (gRPC channels are thread-safe and multiplex calls), the
official ``ArmadaClient`` on it, and every call bounded by ``timeout_s``. A failure's gRPC
status says whether trying again helps: UNAVAILABLE (the server is down or restarting),
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED (rate limits), ABORTED and INTERNAL (Armada answers
INTERNAL when it could not publish to Pulsar: internal/armada/submit/submit.go) are
retryable; NOT_FOUND (an unknown queue, job or job set), INVALID_ARGUMENT,
PERMISSION_DENIED, UNAUTHENTICATED and the rest are not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
from armada_client.armada import event_pb2, job_pb2, submit_pb2
from armada_client.client import ArmadaClient

from connectors.armada.config import ArmadaConnectorConfig
from connectors.armada.jobs import JobEvent
from connectors.armada.proto import QueueInfo, job_event, queue_info
from connectors.base import ConnectorError

RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
    }
)

T = TypeVar("T")
# How long past its deadline a stream may hang before the connector cancels it itself.
WATCHDOG_GRACE_S = 1.0


def connector_error(what: str, error: grpc.RpcError) -> ConnectorError:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    return ConnectorError(f"armada: {what}: {code.name}: {details}", retryable=code in RETRYABLE)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer <token>`` to every call (Armada's token auth)."""

    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


class ArmadaApi:
    """The calls the connector makes; each returns the connector's own types."""

    def __init__(self, config: ArmadaConnectorConfig) -> None:
        self._config = config
        self._timeout_s = config.timeout_s
        self._gpu_resources = config.mapping.gpu_resources
        self._connect()

    def _connect(self) -> None:
        config = self._config
        if config.tls:
            channel = grpc.secure_channel(config.url, grpc.ssl_channel_credentials())
        else:
            channel = grpc.insecure_channel(config.url)
        self._channel = channel
        if config.token is not None:
            channel = grpc.intercept_channel(channel, _BearerToken(config.token.get_secret_value()))
        self.client = ArmadaClient(channel)

    def close(self) -> None:
        self._channel.close()

    @contextmanager
    def _watched(self, stream: Any, what: str) -> Iterator[None]:
        """End ``stream`` if it outlives its deadline. grpcio 1.76 can leave a stream that
        starts while the server goes away (its GOAWAY in flight) waiting past its deadline,
        and cancelling the call does not wake it; closing the channel does. Seen against
        the test server, stopped in this process or in another; a read that never returns
        would stall the connector's telemetry for good. The next call gets a new channel."""
        fired = threading.Event()
        channel = self._channel

        def rescue() -> None:
            fired.set()
            stream.cancel()
            channel.close()

        watchdog = threading.Timer(self._timeout_s + WATCHDOG_GRACE_S, rescue)
        watchdog.daemon = True
        watchdog.start()
        try:
            yield
        except (grpc.RpcError, ValueError) as error:
            # ValueError: grpc's answer to a call on a channel the watchdog closed.
            if fired.is_set():
                raise ConnectorError(
                    f"armada: {what}: no answer within {self._timeout_s} s", retryable=True
                ) from error
            if isinstance(error, grpc.RpcError):
                raise connector_error(what, error) from error
            raise
        finally:
            watchdog.cancel()
            stream.cancel()
            if fired.is_set():
                self._connect()

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except grpc.RpcError as error:
            raise connector_error(what, error) from error
        except ValueError as error:  # armada-client's own check of its arguments
            raise ConnectorError(f"armada: {what}: {error}", retryable=False) from error

    # --- reads ---------------------------------------------------------------------------

    def queues(self) -> list[QueueInfo]:
        found = []
        request = submit_pb2.StreamingQueueGetRequest()
        stream = self.client.queue_stub.GetQueues(request, timeout=self._timeout_s)
        with self._watched(stream, "list queues"):
            for message in stream:
                if message.HasField("end"):
                    break
                if message.HasField("queue"):
                    found.append(queue_info(message.queue))
        return found

    def events(
        self, queue: str, job_set: str, *, after: str
    ) -> Iterator[tuple[str, JobEvent | None]]:
        """The job set's messages after message id ``after`` ("": from the start), up to
        the last one the server has now (``watch: false``); then the stream ends. Each
        comes as its id and its event (None for kinds the connector does not fold, whose
        ids still move the resume point on).

        A job set nothing was submitted to yet reads as empty (``errorIfMissing: false``);
        an unknown queue is NOT_FOUND. A stream that breaks raises after the events it
        delivered: the caller has applied those and resumes after the last one.
        """
        request = event_pb2.JobSetRequest(
            queue=queue, id=job_set, from_message_id=after, watch=False, errorIfMissing=False
        )
        what = f"events of job set {job_set} in queue {queue} after {after or 'the start'}"
        stream = self.client.event_stub.GetJobSetEvents(request, timeout=self._timeout_s)
        with self._watched(stream, what):
            for message in stream:
                try:
                    event = job_event(message, self._gpu_resources)
                except ValueError as error:
                    raise ConnectorError(
                        f"armada: message {message.id} of job set {job_set} in queue "
                        f"{queue}: {error}",
                        retryable=False,
                    ) from error
                yield message.id, event

    # --- changes -------------------------------------------------------------------------

    def submit(
        self, queue: str, job_set: str, items: Sequence[submit_pb2.JobSubmitRequestItem]
    ) -> list[str]:
        """The ids of the jobs made (or, for a resent client id, made before)."""
        response = self._call(
            f"submit {len(items)} job(s) to job set {job_set} in queue {queue}",
            lambda: self.client.submit_jobs(queue, job_set, list(items)),
        )
        failed = [item.error for item in response.job_response_items if item.error]
        if failed:
            raise ConnectorError(
                f"armada: submit to job set {job_set} in queue {queue}: {'; '.join(failed)}",
                retryable=False,
            )
        return [item.job_id for item in response.job_response_items]

    def cancel(self, queue: str, job_set: str, job_id: str, *, reason: str = "") -> None:
        """Cancel one job; Armada keeps ``reason`` (``JobCancelRequest``'s, which
        armada-client's ``cancel_jobs`` does not take, so the stub is called) for
        :meth:`cancel_reason`."""
        request = submit_pb2.JobCancelRequest(
            queue=queue, job_set_id=job_set, job_id=job_id, reason=reason
        )
        self._call(
            f"cancel job {job_id} of job set {job_set} in queue {queue}",
            lambda: self.client.submit_stub.CancelJobs(request, timeout=self._timeout_s),
        )

    def cancel_job_set(self, queue: str, job_set: str) -> None:
        """Cancel every job of a job set that has not ended (``CancelJobSet``, no filter)."""
        self._call(
            f"cancel job set {job_set} in queue {queue}",
            lambda: self.client.cancel_jobset(queue, job_set, []),
        )

    def cancel_reason(self, job_id: str) -> str | None:
        """The reason a job was cancelled with, from ``GetJobDetails`` (Armada's query API:
        its event API leaves the reason off the ``cancelled`` event); None when Armada
        does not know the job."""
        response = self._call(
            f"get the details of job {job_id}",
            lambda: self.client.job_stub.GetJobDetails(
                job_pb2.JobDetailsRequest(job_ids=[job_id]), timeout=self._timeout_s
            ),
        )
        details = response.job_details.get(job_id)
        return None if details is None else str(details.cancel_reason)

    def reprioritize(
        self, queue: str, job_set: str, job_ids: list[str] | None, priority: float
    ) -> dict[str, str]:
        """Armada's answer per job: an empty string where it worked, else why not."""
        which = f"jobs {', '.join(job_ids)}" if job_ids else "every job"
        response = self._call(
            f"reprioritize {which} of job set {job_set} in queue {queue}",
            lambda: self.client.reprioritize_jobs(priority, job_ids, job_set, queue),
        )
        return dict(response.reprioritization_results)

    def preempt(self, queue: str, job_set: str, job_id: str) -> None:
        self._call(
            f"preempt job {job_id} of job set {job_set} in queue {queue}",
            lambda: self.client.preempt_jobs(queue, job_set, job_id),
        )
