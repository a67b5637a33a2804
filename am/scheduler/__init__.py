"""Scheduling cores (pure: no I/O, no threads, time passed in), modelled on Flink's
``runtime/scheduler`` and ``executiongraph/failover``:

- ``regions``: pipelined regions of the execution topology (the unit of failover and of
  lazy batch scheduling);
- ``failover``: which subtasks to restart after a failure (``full`` or ``region``);
- ``restart``: whether and when to restart (none / fixed-delay / failure-rate /
  exponential-delay) and the job's failure history.
"""
