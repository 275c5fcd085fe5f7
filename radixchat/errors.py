"""Errors a user can meet. Each carries a one-line message that says what went wrong and where.

Tracebacks are for bugs; anything raised from here is expected and is shown as ``radixchat: <message>``.
"""

from __future__ import annotations


class RadixchatError(Exception):
    """Base class of every error that is reported to the user as one line."""


class ConfigError(RadixchatError):
    """An invalid setting (file, environment variable or flag)."""


class ModelLoadError(RadixchatError):
    """The model could not be found, converted or loaded, or the engine cannot run it correctly."""


class RequestError(RadixchatError):
    """A request the engine refuses: bad sampling parameters, a prompt that can never fit, ..."""


class PromptTooLongError(RequestError):
    """The prompt does not fit the model's context or the KV pool."""


class EngineStoppedError(RadixchatError):
    """The engine is not running (not started, stopped, or crashed)."""


class SessionError(RadixchatError):
    """A session file is missing, corrupt, of an unknown version, or for another model."""


class RemoteError(RadixchatError):
    """A remote server refused or failed a request (one line: what happened and where)."""


class BackendUnavailableError(ModelLoadError):
    """The remote server cannot be used at all: unreachable, wrong key, or the model is not served."""
