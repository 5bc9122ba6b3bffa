"""Why a topic's route cannot be had: the broker is down, or the topic is missing.

The 5.1.2 client says ``failed to fetch topic:T route.`` for both (its route query logs the cause
and raises that text), so a newcomer cannot tell a stopped broker from a typo. :func:`check_route`
asks the proxy the same question (gRPC ``QueryRoute``) and keeps its answer; :func:`route_hint`
turns it into one line that names the next step.

The 2.x client (remoting: a name server, no proxy) says ``No route info of this topic: T,error:-1,in
file <…DefaultMQProducerImpl.cpp> line:434`` when its name server is down; :func:`check_name_server`
tells that from a name server that answers but has no route for the topic.
"""

from __future__ import annotations

import enum
import socket
from dataclasses import dataclass
from typing import Any

from ..path.message import client_facts

__all__ = ["RouteProblem", "RouteTrouble", "TopicRouteError", "check_name_server", "check_route",
           "explain_legacy_route_failure", "explain_route_failure", "is_legacy_route_failure", "is_route_failure",
           "legacy_route_hint", "route_hint"]

# The 5.1.2 client's text (rocketmq/v5/client/client_route_manager.py retrieve_topic_route_data)
_ROUTE_FAILURE = "failed to fetch topic:"
# The 2.x client's (rocketmq-client-cpp 2.1.0 DefaultMQProducerImpl.cpp, ProducerSend*Failed)
_LEGACY_ROUTE_FAILURE = "No route info of this topic"


class RouteProblem(enum.Enum):
    BROKER_DOWN = "broker_down"  # nothing answers at the endpoint (connection refused, timeout)
    TOPIC_MISSING = "topic_missing"  # the proxy answered TOPIC_NOT_FOUND
    REFUSED = "refused"  # the proxy answered another error (auth, namespace, an internal error)
    # a 2.x producer whose name server was set before rmqtrace saw it: nothing was asked
    UNCHECKED = "unchecked"


@dataclass(frozen=True)
class RouteTrouble:
    problem: RouteProblem
    detail: str  # the proxy's or gRPC's own words, one line


def is_route_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the 5.x client's "failed to fetch topic:T route." (either cause)."""
    return type(exc) is Exception and str(exc).startswith(_ROUTE_FAILURE)


def is_legacy_route_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the 2.x client's "No route info of this topic: T,…" (either cause)."""
    return isinstance(exc, Exception) and str(exc).startswith(_LEGACY_ROUTE_FAILURE)


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


def check_name_server(addresses: str, *, timeout: float = 3.0) -> RouteProblem:
    """Whether any of the 2.x name servers ``addresses`` ("host:port;host:port", as given to
    ``set_name_server_address``) accepts a connection: TOPIC_MISSING (one answers, so the missing
    route is the topic's) or BROKER_DOWN (none does, or none can be parsed)."""
    for address in addresses.split(";"):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            continue
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except (OSError, ValueError):
            continue
        return RouteProblem.TOPIC_MISSING
    return RouteProblem.BROKER_DOWN


def legacy_route_hint(addresses: str | None, topic: str, problem: RouteProblem) -> str:
    """One line for the 2.x client's route failure: which it is, when known, and what to do next."""
    create = f"`bash services/rocketmq/rmq.sh topic {topic}` on the local one; `mqadmin updateTopic` on yours"
    if problem is RouteProblem.BROKER_DOWN:
        return (f"no RocketMQ name server answers at {addresses}: start one (`make stack` runs one on "
                f"127.0.0.1:9876) or point set_name_server_address() at yours")
    if problem is RouteProblem.TOPIC_MISSING:
        return (f"the name server at {addresses} has no route for topic {topic!r}: create the topic ({create}), "
                f"or start a broker that serves it")
    return (f"no route for topic {topic!r}: either no name server answers at the address given to "
            f"set_name_server_address() (`make stack` runs one on 127.0.0.1:9876) or the topic does not exist "
            f"there ({create})")


class TopicRouteError(Exception):
    """The client's "no route for this topic", explained in one line (:func:`route_hint`,
    :func:`legacy_route_hint`).

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


def explain_legacy_route_failure(exc: BaseException, name_server: str | None, topic: Any) -> TopicRouteError | None:
    """A :class:`TopicRouteError` for the 2.x client's route failure ``exc`` (``name_server``: what
    its producer was given, None when rmqtrace did not see it), or None for another error. Never raises."""
    if not is_legacy_route_failure(exc) or not isinstance(topic, str) or not topic:
        return None
    try:
        problem = check_name_server(name_server) if name_server else RouteProblem.UNCHECKED
    except Exception:  # noqa: BLE001 - say both causes rather than lose the client's error
        problem = RouteProblem.UNCHECKED
    return TopicRouteError(legacy_route_hint(name_server, topic, problem), problem, exc)
