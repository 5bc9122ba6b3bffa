"""Why a topic's route cannot be had: the broker is down, or the topic is missing.

The 5.1.2 client says ``failed to fetch topic:T route.`` for both (its route query logs the cause
and raises that text), so a newcomer cannot tell a stopped broker from a typo. :func:`check_route`
asks the proxy the same question (gRPC ``QueryRoute``) and keeps its answer; :func:`route_hint`
turns it into one line that names the next step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ..path.message import client_facts

__all__ = ["RouteProblem", "RouteTrouble", "TopicRouteError", "check_route", "explain_route_failure",
           "is_route_failure", "route_hint"]

# The 5.1.2 client's text (rocketmq/v5/client/client_route_manager.py retrieve_topic_route_data)
_ROUTE_FAILURE = "failed to fetch topic:"


class RouteProblem(enum.Enum):
    BROKER_DOWN = "broker_down"  # nothing answers at the endpoint (connection refused, timeout)
    TOPIC_MISSING = "topic_missing"  # the proxy answered TOPIC_NOT_FOUND
    REFUSED = "refused"  # the proxy answered another error (auth, namespace, an internal error)


@dataclass(frozen=True)
class RouteTrouble:
    problem: RouteProblem
    detail: str  # the proxy's or gRPC's own words, one line


def is_route_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the 5.x client's "failed to fetch topic:T route." (either cause)."""
    return type(exc) is Exception and str(exc).startswith(_ROUTE_FAILURE)


def check_route(endpoint: str, topic: str, *, namespace: str = "", timeout: float = 3.0) -> RouteTrouble | None:
    """Ask the proxy at ``endpoint`` for ``topic``'s route: None when it has one, else why not.

    Raises:
        ImportError: the 5.x client (which brings grpcio) is not installed.
        ValueError: ``timeout`` is not positive.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 s, got {timeout!r}")
    import grpc  # type: ignore[import-untyped]  # grpcio ships no stubs; it comes with the 5.x client

    from .quiet import import_quietly

    rocketmq = import_quietly()
    from rocketmq.grpc_protocol import Code, MessagingServiceStub, QueryRouteRequest

    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), namespace=namespace)
    req = QueryRouteRequest()
    req.topic.name = topic
    req.topic.resource_namespace = namespace
    # the client's own parse of HOST:PORT (the proxy refuses an endpoint without its scheme)
    req.endpoints.CopyFrom(config.rpc_endpoints.endpoints)
    # the proxy refuses a request without a client id (CLIENT_ID_REQUIRED) before it looks at the topic
    metadata = [("x-mq-client-id", "rmqtrace-route-check"), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "v2")]
    channel = grpc.insecure_channel(endpoint)
    try:
        res: Any = MessagingServiceStub(channel).QueryRoute(req, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        words = " ".join(str(exc.details() if hasattr(exc, "details") else exc).split())
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return RouteTrouble(RouteProblem.BROKER_DOWN, words)
        return RouteTrouble(RouteProblem.REFUSED, f"{code.name if code else 'gRPC error'}: {words}")
    finally:
        channel.close()
    if res.status.code == Code.OK:
        return None
    words = " ".join(res.status.message.split())
    if res.status.code == Code.TOPIC_NOT_FOUND:
        return RouteTrouble(RouteProblem.TOPIC_MISSING, words)
    return RouteTrouble(RouteProblem.REFUSED, f"{Code.Name(res.status.code)}: {words}")


def route_hint(endpoint: str, topic: str, trouble: RouteTrouble) -> str:
    """One line: which of the two it is, and what to do next."""
    if trouble.problem is RouteProblem.BROKER_DOWN:
        return (f"no RocketMQ proxy answers at {endpoint}: start one (`make stack` runs one on 127.0.0.1:8081) "
                f"or point the endpoint at yours")
    if trouble.problem is RouteProblem.TOPIC_MISSING:
        return (f"topic {topic!r} does not exist on the broker at {endpoint}: create it "
                f"(`bash services/rocketmq/rmq.sh topic {topic}` on the local one; `mqadmin updateTopic` on yours)")
    return f"the proxy at {endpoint} refused the route of topic {topic!r}: {trouble.detail[:200]}"


class TopicRouteError(Exception):
    """The 5.x client's ``failed to fetch topic:T route.``, explained in one line (:func:`route_hint`).

    ``problem`` says which it was; the client's own exception is ``client_error``.
    """

    def __init__(self, hint: str, problem: RouteProblem, client_error: BaseException) -> None:
        super().__init__(hint)
        self.problem = problem
        self.client_error = client_error


def explain_route_failure(exc: BaseException, client: Any, topic: Any) -> TopicRouteError | None:
    """A :class:`TopicRouteError` for the client's route failure ``exc``, or None when ``exc`` is
    another error, the client's endpoint cannot be read, or the proxy has the route after all.
    Never raises."""
    if not is_route_failure(exc) or not isinstance(topic, str) or not topic:
        return None
    facts = client_facts(client)
    if not facts.server_address or not facts.server_port:
        return None
    endpoint = f"{facts.server_address}:{facts.server_port}"
    try:
        trouble = check_route(endpoint, topic, namespace=facts.namespace or "")
    except Exception:  # noqa: BLE001 - the client's own error is raised then
        return None
    if trouble is None:
        return None
    return TopicRouteError(route_hint(endpoint, topic, trouble), trouble.problem, exc)
