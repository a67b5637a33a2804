"""The TaskExecutor process: slot table, task threads, operators, Arrow data exchange."""
