"""Batch operators that work in a managed-memory budget and spill to disk: the hybrid hash join
(``hash_join``), spilling aggregations (``aggregate``), the external sort (``sort``)."""
