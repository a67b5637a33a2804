"""Operator state: the keyed state backend and what snapshots of it are made of.

- ``heap``: ``HeapKeyedStateBackend``, the in-memory keyed state backend of one keyed operator:
  per-key states (value, list, map, reducing) with namespaces, timers, and columnar states, all
  scoped to key groups and snapshotted copy-on-write.
- ``timers``: ``InternalTimerService``, event- and processing-time timers per (key, namespace),
  kept in the backend (so they are checkpointed and rescaled with it).
- ``columnar``: ``AggregateTable`` (one row of aggregates per key, as columns) and
  ``NamespacedTables`` (immutable Arrow tables per namespace), for vectorised operators.
- ``tables``: ``AsyncSnapshot`` and the helpers operators use to write and read their state as
  Arrow tables.
- ``rocksdb``: ``RocksDBKeyedStateBackend`` (``state.backend.type: rocksdb``), the same
  interface with the per-key entries and timers in RocksDB; ``rocksdb_files``: its snapshots'
  upload (incremental: shared SST files) and restore; ``localdir``: its working folders, per
  task attempt, removed when the task ends.
- ``errors``: the runtime's StateErrors.
"""
