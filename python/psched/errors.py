# SPDX-License-Identifier: Apache-2.0
"""psched's exceptions. The C++ client's psched::Error arrives as the class of its error
category, with the server's message and `code`, the C++ ErrorCode's name."""


class Error(RuntimeError):
    """A psched failure. `code` names it: "shape_mismatch", "unknown_variable", "bad_config",
    ... (common/error.h lists them all)."""

    def __init__(self, message, code="invalid_argument"):
        super().__init__(message)
        self.code = code


class DisconnectedError(Error, ConnectionError):
    """A shard cannot be reached, or the connection to it was lost."""


class OverloadedError(Error):
    """A shard is out of capacity for now; retrying later may succeed."""


class UnimplementedError(Error, NotImplementedError):
    """The shard does not support the request."""
