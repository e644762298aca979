"""One exception tree for warmgate (in the spirit of httpx's `HTTPError` tree): every error
of ours is a `WarmgateError`, and its phase says where it happened. Catch a phase to handle
all of its kinds, or `WarmgateError` for anything of ours. Classes that were a `ValueError`,
`RuntimeError` or `OSError` before stay one too (multiple inheritance), so no caller changes.

    WarmgateError
    ├── ConfigurationError      settings, engines that do not match them, missing environments
    ├── InputError              data that does not follow its format (events, traces, slices)
    ├── RoutingError            no instance, no tokens for precise mode
    ├── StateError              the shared state store cannot be reached
    ├── UpstreamError           an engine, a tierd or an engine's replay failed us
    ├── ClientGoneError         the client left, or the attempt was abandoned
    ├── AdminError              a fleet change or an admin call was refused
    └── ApiError                an OpenAI-shaped error answer (status, type, code)
"""

from __future__ import annotations


class WarmgateError(Exception):
    """The root of every warmgate exception."""


class ConfigurationError(WarmgateError):
    """Settings are wrong, or what they name does not match them."""


class InputError(WarmgateError):
    """Data that does not follow its format."""


class RoutingError(WarmgateError):
    """A request could not be routed as asked."""


class StateError(WarmgateError):
    """The shared state store failed."""


class UpstreamError(WarmgateError):
    """Something the gateway or the engine depends on failed: an engine, a tierd, a replay."""


class ClientGoneError(WarmgateError):
    """The client is gone or its attempt was given up; nothing is left to answer."""


class AdminError(WarmgateError):
    """An admin call (a fleet change, the admin CLI) was refused or failed."""


class ApiError(WarmgateError):
    """An error answer in the OpenAI shape (gateway.errors.OpenAIError)."""
