"""The REST API's refusals: an ``ApiError`` becomes ``{"errors": [message]}`` with its status."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
