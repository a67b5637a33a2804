"""``pyflink.common.serialization``: the encoders and schemas yarnflow's PyFlink layer knows."""

from __future__ import annotations

__all__ = ["Encoder", "SimpleStringSchema"]


class Encoder:
    def __init__(self, kind: str, charset: str = "UTF-8") -> None:
        self._kind, self.charset = kind, charset

    @staticmethod
    def simple_string_encoder(charset_name: str = "UTF-8") -> Encoder:
        return Encoder("simple_string", charset_name)


class SimpleStringSchema:
    def __init__(self, charset: str = "UTF-8") -> None:
        self.charset = charset
