"""High availability with ZooKeeper (``high-availability.type: zookeeper``), with kazoo.

ZooKeeper holds the election and small pointers; bulky data goes to
``high-availability.storageDir`` (any fsspec URL). Layout, under
``/<high-availability.zookeeper.path.root>/<high-availability.cluster-id>``::

    leader/latch                 the election (kazoo Lock recipe nodes; the lowest leads)
    leader/address               {"address": HOST:PORT, "session_id": ...}, ephemeral
    jobgraphs/<job>              {"path": URL of the serialized JobGraph under <storageDir>/jobgraphs/}
    checkpoints/<job>/<n>        the URL of checkpoint n's _metadata (n zero-padded to 19 digits)
    checkpoint-counter/<job>     the next checkpoint id (an int as text)
    job-results/<job>            {"result": base64 JobResult, "created_ms", "fetched", "extra"}
    shutdown                     exists once the cluster was shut down

Modules: ``client`` (the connection, its states and what the services do on each; bounded
calls; fenced transactions), ``election``, ``retrieval``, ``stores``, ``services``.
"""

from __future__ import annotations

from yarnflow.common.ha.zookeeper.services import ZooKeeperHaServices

__all__ = ["ZooKeeperHaServices"]
