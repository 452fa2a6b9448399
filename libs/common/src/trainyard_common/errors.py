"""The two kinds of failure every consumer must tell apart (at-least-once delivery).

A *permanent* error will fail again on every redelivery (a malformed message, a job that
breaks a rule): the consumer records or publishes the rejection and the message is
terminated. A *transient* error may pass later (a store or bus hiccup): the message is
negatively acknowledged and JetStream redelivers it after a delay.
"""


class TrainyardError(Exception):
    """Root of the project's own errors."""


class PermanentError(TrainyardError):
    """Retrying cannot help; the message is terminated, not redelivered."""


class TransientError(TrainyardError):
    """Retrying may help; the message is redelivered after a delay."""


class BusUnavailable(TransientError):
    """The bus did not store a message: it is down, restarting, or its ack did not come
    in time (a retry with the same message id is stored once). A request that meets it
    is answered 503 with Retry-After (runtime.health_app), never a 500."""


class ReplayIncomplete(TransientError):
    """A replay of the stream stopped before the sequence it was to reach (the server
    stopped answering): what it read is not the whole, and nothing may be decided
    from it as if it were (``yard admin rebuild``)."""
