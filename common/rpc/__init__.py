"""RPC helpers: the only package that imports the generated Thrift code (``gen/``)."""
