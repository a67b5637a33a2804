"""What the AppMaster, the TaskExecutors and the client share: ids, messages, the JobGraph,
configuration, errors, clocks, RPC helpers and storage."""
