"""The configuration options of the REST API and web UI, the history server and the metrics
(part of ``config.Options``, which takes them from here)."""

from __future__ import annotations

from yarnflow.common.config_types import (
    _opt,
    _parse_bool,
    _parse_int,
    _parse_str,
    parse_duration_ms,
    parse_port_range,
    parse_size_bytes,
)


class WebOptions:
    REST_ADDRESS = _opt("rest.address", _parse_str, "address clients reach the AppMaster's REST API and web UI at "
                        "(and the one it binds to, unless rest.bind-address is set)")
    REST_BIND_ADDRESS = _opt("rest.bind-address", _parse_str, "address the REST API and web UI bind to (empty: "
                             "rest.address; 0.0.0.0: every interface)")
    REST_PORT = _opt("rest.port", parse_port_range, "port (or range: the first free one) of the REST API and web UI")
    REST_ENABLED = _opt("rest.enabled", _parse_bool, "serve the REST API and web UI")
    WEB_SUBMIT = _opt("web.submit.enable", _parse_bool, "job files may be uploaded and run over REST (/jars)")
    REST_AUTH = _opt("rest.authentication", _parse_str,
                     "who may use the REST API and web UI: token (the cluster's token: a bearer token, the "
                     "password of HTTP basic, or the web UI's login), none, or auto (token when "
                     "security.ssl.internal.enabled is on)", choices=("auto", "token", "none"))
    SSL_REST = _opt("security.ssl.rest.enabled", _parse_bool, "serve the REST API and web UI over HTTPS")
    SSL_REST_CERT = _opt("security.ssl.rest.cert-file", _parse_str,
                         "HTTPS certificate (PEM; empty: the cluster's own, which browsers do not know)")
    SSL_REST_KEY = _opt("security.ssl.rest.key-file", _parse_str, "its private key (PEM)")
    METRICS_REPORTERS = _opt("metrics.reporters", _parse_str, "metric reporters: prom, or empty for none",
                             choices=("", "prom"))
    PROM_HOST = _opt("metrics.reporter.prom.host", _parse_str, "address the Prometheus endpoints bind to")
    PROM_PORT = _opt("metrics.reporter.prom.port", parse_port_range,
                     "port range of the Prometheus endpoints: each process takes the first free one")
    TASK_IO_METRICS = _opt("metrics.task-io.enabled", _parse_bool,
                           "count bytes and busy / idle / back-pressured time of every task")
    REST_MAX_JSON_DEPTH = _opt("rest.server.max-json-depth", _parse_int,
                               "the deepest nesting of arrays and objects a REST request body may have", minimum=1)
    REST_MAX_CONTENT_LENGTH = _opt("rest.server.max-content-length", parse_size_bytes,
                                   "the largest request body the REST API takes (a job artifact upload)")
    ARCHIVE_DIR = _opt("jobmanager.archive.fs.dir", _parse_str,
                       "fsspec folder the AppMaster archives each ended job's REST answers into, for the history "
                       "server (empty: none)")
    HISTORY_DIRS = _opt("historyserver.archive.fs.dir", _parse_str,
                        "comma-separated folders the history server reads job archives from")
    HISTORY_REFRESH = _opt("historyserver.archive.fs.refresh-interval", parse_duration_ms,
                           "how often the history server looks for new archives", minimum=1)
    HISTORY_ADDRESS = _opt("historyserver.web.address", _parse_str, "address the history server binds to")
    HISTORY_PORT = _opt("historyserver.web.port", _parse_int, "port of the history server (0: any free port)",
                        minimum=0, maximum=65535)
    FLAMEGRAPH_ENABLED = _opt("rest.flamegraph.enabled", _parse_bool,
                              "serve flame graphs of a vertex's tasks (sampled by the TaskExecutors only when asked)")
    FLAMEGRAPH_REFRESH = _opt("rest.flamegraph.refresh-interval", parse_duration_ms,
                              "a flame graph's samples older than this are taken afresh when it is asked for", minimum=1)
    FLAMEGRAPH_CLEANUP = _opt("rest.flamegraph.cleanup-interval", parse_duration_ms,
                              "samples of a flame graph nobody asked for this long are dropped", minimum=1)
    FLAMEGRAPH_NUM_SAMPLES = _opt("rest.flamegraph.num-samples", _parse_int,
                                  "samples of each task's thread a flame graph is made of", minimum=1, maximum=1000)
    FLAMEGRAPH_DELAY = _opt("rest.flamegraph.delay-between-samples", parse_duration_ms,
                            "time between two samples of a task's thread", minimum=0, maximum=300)
    FLAMEGRAPH_STACK_DEPTH = _opt("rest.flamegraph.stack-depth", _parse_int,
                                  "innermost frames of a sampled stack kept", minimum=1, maximum=1000)
