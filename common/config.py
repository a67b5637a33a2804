"""Configuration: typed options with defaults from conf/yarnflow.yaml, overridable by a user
file and by ``-D key=value``.

Every key yarnflow knows is declared in ``OPTIONS`` with a type; the shipped yaml must list
exactly these keys (a test keeps them in step). Keys under ``spark.`` are for Spark stages,
passed through as strings to the TaskExecutors' SparkSession. An unknown key or a value of the wrong type raises ``ConfigurationError``
naming the key and where it came from.

Some keys may be declared before their feature exists: they are
listed in ``NOT_SUPPORTED_YET`` and any value other than their shipped default is refused with
a ``ConfigurationError`` ("not supported yet"), so a user never believes a setting took effect
when it did nothing. A feature that lands removes its entries there.
"""

from __future__ import annotations

import difflib
import functools
import os
from importlib import resources
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from yarnflow.common.config_types import (
    ConfigOption,
    _opt,
    _parse_bool,
    _parse_bool_or_auto,
    _parse_float,
    _parse_optional_float,
    _parse_int,
    _parse_optional_duration_ms,
    _parse_optional_size,
    _parse_str,
)
from yarnflow.common.config_types import parse_buffer_timeout_ms, parse_duration_ms, parse_size_bytes
from yarnflow.common.config_web import WebOptions
from yarnflow.common.errors import ConfigurationError

T = TypeVar("T")

class Options(WebOptions):
    """Every configuration option, by attribute (those of the REST API, the web UI and the
    metrics in ``config_web.WebOptions``)."""

    PARALLELISM = _opt("parallelism.default", _parse_int, "default parallelism of operators", minimum=1)
    MAX_PARALLELISM = _opt("pipeline.max-parallelism", _parse_int, "number of key groups", minimum=1)
    RUNTIME_MODE = _opt("execution.runtime-mode", _parse_str, "STREAMING, BATCH or AUTOMATIC",
                        choices=("STREAMING", "BATCH", "AUTOMATIC"))
    BUFFER_TIMEOUT = _opt("execution.buffer-timeout", parse_buffer_timeout_ms,
                          "output flush interval (-1: flush a channel's batch only when it is full, as Flink's)")
    BATCH_SIZE = _opt("execution.batch-size", _parse_int, "target rows per channel batch", minimum=1)
    RPC_ADDRESS = _opt("jobmanager.rpc.address", _parse_str, "address the AppMaster binds to")
    RPC_PORT = _opt("jobmanager.rpc.port", _parse_int, "AppMaster RPC port (0: any free port)", minimum=0)
    FAILOVER_STRATEGY = _opt("jobmanager.execution.failover-strategy", _parse_str,
                             "region (restart the failed pipelined region) or full", choices=("full", "region"))
    SCHEDULER = _opt("jobmanager.scheduler", _parse_str,
                     "default (a job runs at the parallelism it was given) or adaptive (at the parallelism the "
                     "cluster's slots allow, up to the one it was given; it follows slots lost and added)",
                     choices=("default", "adaptive"))
    SCHEDULER_MODE = _opt("scheduler-mode", _parse_str,
                          "reactive: every job uses all of the cluster's slots, up to its max parallelism "
                          "(the adaptive scheduler, with no stabilization wait)", choices=("", "reactive"))
    ADAPTIVE_RESOURCE_WAIT = _opt("jobmanager.adaptive-scheduler.resource-wait-timeout", parse_duration_ms,
                                  "adaptive: how long a job short of slots waits for workers being started before "
                                  "it runs on at the parallelism of the slots it has")
    ADAPTIVE_STABILIZATION = _opt("jobmanager.adaptive-scheduler.resource-stabilization-timeout",
                                  parse_duration_ms, "adaptive: how long a job short of slots, with no workers "
                                  "being started, waits before it runs on at the parallelism of the slots it has")
    ADAPTIVE_MIN_INCREASE = _opt("jobmanager.adaptive-scheduler.min-parallelism-increase", _parse_int,
                                 "adaptive: the smallest increase of parallelism worth a rescale", minimum=1)
    ADAPTIVE_SCALING_INTERVAL = _opt("jobmanager.adaptive-scheduler.scaling-interval.min", parse_duration_ms,
                                     "adaptive: the least time between a job's rescale and its next rescale up")
    ADAPTIVE_DESIRED = _opt("jobmanager.adaptive-scheduler.desired-parallelism", _parse_int,
                            "adaptive: the parallelism a job grows to when slots allow (0: the one it was "
                            "submitted with; reactive mode: its max parallelism)", minimum=0)
    RESTART_STRATEGY = _opt("restart-strategy.type", _parse_str, "restart strategy",
                            choices=("", "none", "off", "disable", "fixed-delay", "fixeddelay", "failure-rate",
                                     "failurerate", "exponential-delay", "exponentialdelay"))
    FIXED_DELAY_ATTEMPTS = _opt("restart-strategy.fixed-delay.attempts", _parse_int, "restarts", minimum=0)
    FIXED_DELAY_DELAY = _opt("restart-strategy.fixed-delay.delay", parse_duration_ms, "delay between restarts")
    FAILURE_RATE_MAX = _opt("restart-strategy.failure-rate.max-failures-per-interval", _parse_int,
                            "failures allowed per interval", minimum=1)
    FAILURE_RATE_INTERVAL = _opt("restart-strategy.failure-rate.failure-rate-interval", parse_duration_ms,
                                 "failure rate interval")
    FAILURE_RATE_DELAY = _opt("restart-strategy.failure-rate.delay", parse_duration_ms, "delay between restarts")
    EXP_INITIAL = _opt("restart-strategy.exponential-delay.initial-backoff", parse_duration_ms, "first backoff")
    EXP_MAX = _opt("restart-strategy.exponential-delay.max-backoff", parse_duration_ms, "largest backoff")
    EXP_MULTIPLIER = _opt("restart-strategy.exponential-delay.backoff-multiplier", _parse_float,
                          "backoff growth", minimum=1)
    EXP_RESET = _opt("restart-strategy.exponential-delay.reset-backoff-threshold", parse_duration_ms,
                     "stable time after which the backoff resets")
    EXP_JITTER = _opt("restart-strategy.exponential-delay.jitter-factor", _parse_float, "backoff jitter",
                      minimum=0)
    EXP_ATTEMPTS = _opt("restart-strategy.exponential-delay.attempts-before-reset-backoff", _parse_str,
                        "restarts before giving up (empty: no limit)")
    CHECKPOINT_INTERVAL = _opt("execution.checkpointing.interval", _parse_optional_duration_ms,
                               "checkpoint period of STREAMING jobs (empty: no checkpoints)")
    CHECKPOINT_MODE = _opt("execution.checkpointing.mode", _parse_str, "EXACTLY_ONCE or AT_LEAST_ONCE",
                           choices=("EXACTLY_ONCE", "AT_LEAST_ONCE"))
    CHECKPOINT_UNALIGNED = _opt("execution.checkpointing.unaligned.enabled", _parse_bool,
                                "barriers overtake buffered data, which is stored with the checkpoint "
                                "(exactly-once only; savepoints stay aligned)")
    ALIGNED_CHECKPOINT_TIMEOUT = _opt("execution.checkpointing.aligned-checkpoint-timeout", parse_duration_ms,
                                      "with unaligned checkpoints: start aligned, go unaligned once a checkpoint "
                                      "is this old (0: unaligned from the start)")
    CHECKPOINT_TIMEOUT = _opt("execution.checkpointing.timeout", parse_duration_ms,
                              "a checkpoint not complete after this long is aborted")
    CHECKPOINT_MIN_PAUSE = _opt("execution.checkpointing.min-pause", parse_duration_ms,
                                "least time between the end of a checkpoint and the start of the next")
    CHECKPOINT_MAX_CONCURRENT = _opt("execution.checkpointing.max-concurrent-checkpoints", _parse_int,
                                     "checkpoints in progress at once", minimum=1)
    CHECKPOINT_TOLERABLE_FAILURES = _opt("execution.checkpointing.tolerable-failed-checkpoints", _parse_int,
                                         "consecutive failed checkpoints before the tasks that held the last one up fail "
                                         "over (as the restart strategy allows)", minimum=0)
    CHECKPOINT_NUM_RETAINED = _opt("execution.checkpointing.num-retained", _parse_int,
                                   "completed checkpoints kept", minimum=1)
    CHECKPOINT_DIR = _opt("execution.checkpointing.dir", _parse_str,
                          "fsspec URL of the checkpoints (empty: <storage dir>/checkpoints)")
    CHECKPOINT_RETENTION = _opt("execution.checkpointing.externalized-checkpoint-retention", _parse_str,
                                "what becomes of a job's checkpoints when it ends: deleted "
                                "(NO_EXTERNALIZED_CHECKPOINTS), kept when it fails (DELETE_ON_CANCELLATION), or "
                                "kept when it fails or is cancelled (RETAIN_ON_CANCELLATION), to start it again "
                                "with run -s",
                                choices=("NO_EXTERNALIZED_CHECKPOINTS", "DELETE_ON_CANCELLATION",
                                         "RETAIN_ON_CANCELLATION"))
    CHECKPOINT_INCREMENTAL = _opt("execution.checkpointing.incremental", _parse_bool,
                                  "rocksdb state backend: checkpoints upload only new SST files and reference "
                                  "the unchanged ones in <checkpoint dir>/shared")
    STATE_BACKEND = _opt("state.backend.type", _parse_str, "where keyed state lives: hashmap (in memory) or "
                         "rocksdb (on local disk)", choices=("hashmap", "rocksdb"))
    LOCAL_RECOVERY = _opt("state.backend.local-recovery", _parse_bool,
                          "task-local recovery: each TaskExecutor keeps a copy of its tasks' latest snapshots, and a "
                          "task restored on it reads its state there (the checkpoint storage's for a missing or "
                          "corrupt copy)")
    ROCKSDB_LOCALDIR = _opt("state.backend.rocksdb.localdir", _parse_str,
                            "working folder of the rocksdb state backend (empty: the TaskExecutor's work dir); "
                            "a task's files are removed when it ends")
    ROCKSDB_MEMORY_MANAGED = _opt("state.backend.rocksdb.memory.managed", _parse_bool,
                                  "the RocksDB state backends of a slot share one block cache and write buffer "
                                  "manager, sized to the slot's managed memory")
    ROCKSDB_MEMORY_FIXED = _opt("state.backend.rocksdb.memory.fixed-per-slot", _parse_optional_size,
                                "a fixed size for the shared RocksDB memory of a slot instead of its managed memory")
    ROCKSDB_WRITE_BUFFER_RATIO = _opt("state.backend.rocksdb.memory.write-buffer-ratio", _parse_float,
                                      "the part of the shared RocksDB memory that write buffers (memtables) may take",
                                      minimum=0.05)
    SAVEPOINT_PATH = _opt("execution.savepoint.path", _parse_str,
                          "savepoint the job starts from (yarnflow run -s PATH)")
    SAVEPOINT_IGNORE_UNCLAIMED = _opt("execution.savepoint.ignore-unclaimed-state", _parse_bool,
                                      "start even when the savepoint has state for operators the job does not "
                                      "have (yarnflow run --allow-non-restored-state)")
    SAVEPOINTS_DIR = _opt("state.savepoints.dir", _parse_str, "default folder (fsspec URL) for savepoints")
    SLOT_IDLE_TIMEOUT = _opt("slot.idle.timeout", parse_duration_ms, "a JobMaster keeps an unused slot this long")
    PREVIOUS_WORKER_RECOVERY_TIMEOUT = _opt("resourcemanager.previous-worker.recovery.timeout", parse_duration_ms,
                                            "a new leader waits this long for the previous leader's "
                                            "TaskExecutors before it starts new ones")
    TM_IDLE_TIMEOUT = _opt("resourcemanager.taskmanager-timeout", parse_duration_ms,
                           "release TaskExecutors idle this long (above the minimum slots)")
    SLOT_REQUEST_TIMEOUT = _opt("slot.request.timeout", parse_duration_ms,
                                "a job fails when its slots do not come within this time")
    RPC_TIMEOUT = _opt("rpc.timeout", parse_duration_ms, "remote call timeout")
    CLIENT_TIMEOUT = _opt("client.timeout", parse_duration_ms, "client wait for the cluster")
    MIN_SLOTS = _opt("slotmanager.number-of-slots.min", _parse_int, "slots to keep", minimum=0)
    MAX_SLOTS = _opt("slotmanager.number-of-slots.max", _parse_int, "slot limit", minimum=1)
    HEARTBEAT_INTERVAL = _opt("heartbeat.interval", parse_duration_ms, "heartbeat period")
    HEARTBEAT_TIMEOUT = _opt("heartbeat.timeout", parse_duration_ms, "heartbeat timeout")
    NUM_SLOTS = _opt("taskmanager.numberOfTaskSlots", _parse_int, "slots per TaskExecutor", minimum=1)
    SLOT_PROCESSES = _opt("taskmanager.slot-processes", _parse_bool_or_auto,
                          "true: a worker (YARN container) of several slots runs each slot as a one-slot "
                          "TaskExecutor process of its own, with its share of the memory and cores (Python code "
                          "then uses a core per slot); false: its slots are threads of one process; auto: true "
                          "in a YARN container, false elsewhere")
    TM_CPU = _opt("taskmanager.cpu.cores", _parse_optional_float,
                  "cores per TaskExecutor (empty or 0: one per slot; use taskexecutor_cores())", minimum=0)
    TM_MEMORY = _opt("taskmanager.memory.process.size", parse_size_bytes, "TaskExecutor memory")
    MANAGED_MEMORY_SIZE = _opt("taskmanager.memory.managed.size", _parse_optional_size,
                               "managed memory of a TaskExecutor, split evenly between its slots: the working "
                               "memory of batch joins, aggregations and sorts (empty: the fraction below)")
    MANAGED_MEMORY_FRACTION = _opt("taskmanager.memory.managed.fraction", _parse_float,
                                   "managed memory as a fraction of taskmanager.memory.process.size, when "
                                   "taskmanager.memory.managed.size is empty", minimum=0)
    JOIN_BROADCAST_THRESHOLD = _opt("table.optimizer.join.broadcast-threshold", parse_size_bytes,
                                    "a BATCH join whose smaller input is estimated at most this large sends "
                                    "that input to every subtask of the join (a broadcast join; 0: never)")
    AUTO_PARALLELISM = _opt("execution.batch.adaptive.auto-parallelism.enabled", _parse_bool,
                            "BATCH jobs: the parallelism of an operator given none is decided when its inputs are "
                            "complete, from their bytes (the adaptive batch scheduler)")
    AUTO_MIN_PARALLELISM = _opt("execution.batch.adaptive.auto-parallelism.min-parallelism", _parse_int,
                                "adaptive batch: the least parallelism it decides", minimum=1)
    AUTO_MAX_PARALLELISM = _opt("execution.batch.adaptive.auto-parallelism.max-parallelism", _parse_int,
                                "adaptive batch: the most parallelism it decides (0: the job's default "
                                "parallelism)", minimum=0)
    AUTO_AVG_BYTES = _opt("execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task", parse_size_bytes,
                          "adaptive batch: the input bytes each subtask is meant to get")
    AUTO_SOURCE_PARALLELISM = _opt("execution.batch.adaptive.auto-parallelism.default-source-parallelism",
                                   _parse_int, "adaptive batch: the parallelism of sources given none (0: the "
                                   "job's default parallelism)", minimum=0)
    TASK_OFF_HEAP = _opt("taskmanager.memory.task.off-heap.size", _parse_optional_size,
                         "the most Arrow's memory pool of a TaskExecutor may hold (its operators' batches); "
                         "more fails its tasks naming this key (empty: only the process size bounds it)")
    WATCHDOG_INTERVAL = _opt("taskmanager.memory.watchdog.interval", parse_duration_ms,
                             "how often a TaskExecutor measures its resident memory (0: no watchdog)")
    WATCHDOG_WARN = _opt("taskmanager.memory.watchdog.warn-ratio", _parse_float,
                         "a TaskExecutor using this part of taskmanager.memory.process.size logs and reports it",
                         minimum=0)
    WATCHDOG_FAIL = _opt("taskmanager.memory.watchdog.fail-ratio", _parse_float,
                         "a TaskExecutor using this part of taskmanager.memory.process.size fails its tasks "
                         "(before YARN kills its container)", minimum=0)
    MAX_MEMORY_FAILURES = _opt("restart-strategy.max-memory-failures", _parse_int,
                               "a job fails for good when its tasks ran out of their TaskExecutor's memory this "
                               "many times in a row with no checkpoint completed in between (0: no limit)",
                               minimum=0)
    TM_HOST = _opt("taskmanager.host", _parse_str, "address TaskExecutors bind to")
    TASK_CANCELLATION_TIMEOUT = _opt("task.cancellation.timeout", parse_duration_ms,
                                     "a task that does not stop this long after its cancel ends its TaskExecutor "
                                     "(0: never)")
    SSL_INTERNAL = _opt("security.ssl.internal.enabled", _parse_bool,
                        "mutual TLS on every RPC and data connection inside the cluster (docs/security.md)")
    SSL_INTERNAL_CERT = _opt("security.ssl.internal.cert-file", _parse_str,
                             "the cluster's certificate (PEM; empty: made when the cluster starts)")
    SSL_INTERNAL_KEY = _opt("security.ssl.internal.key-file", _parse_str,
                            "the cluster's private key (PEM, readable by its owner only; empty: made with the "
                            "certificate)")
    KRB_KEYTAB = _opt("security.kerberos.login.keytab", _parse_str,
                      "YARN with Kerberos: the keytab the client logs in with (its skein driver) and ships to "
                      "the application's containers, which renew their tickets with it")
    KRB_PRINCIPAL = _opt("security.kerberos.login.principal", _parse_str, "the principal of that keytab")
    KRB_FILE_SYSTEMS = _opt("security.kerberos.access.hadoopFileSystems", _parse_str,
                            "comma-separated Hadoop file systems (hdfs://nn:8020) the application gets delegation "
                            "tokens for, besides the ones of its storage and staging directories")
    KRB_RELOGIN = _opt("security.kerberos.relogin.period", parse_duration_ms,
                       "how often a container renews its Kerberos ticket from the keytab")
    RPC_MAX_STRING = _opt("rpc.max-string-size", parse_size_bytes,
                          "the largest string or binary a Thrift call may carry (a bigger one ends its connection)")
    RPC_MAX_CONTAINER = _opt("rpc.max-container-items", _parse_int,
                             "the most items of a list, set or map in a Thrift call", minimum=1)
    RPC_MAX_MESSAGE = _opt("rpc.max-message-size", parse_size_bytes,
                           "the largest Thrift call (one framed message) a server reads; a bigger one ends its "
                           "connection before it is read", minimum=1, maximum=0x3FFFFFFF)
    RPC_MAX_NESTING = _opt("rpc.max-nesting-depth", _parse_int,
                           "how deep the structs and containers of a Thrift call may nest (Thrift's decoder stops at "
                           "64; lower: every call is scanned before it is decoded)", minimum=1, maximum=64)
    MAX_JOB_SUBTASKS = _opt("jobmanager.job-graph.max-subtasks", _parse_int,
                            "the most subtasks (the sum of its vertices' parallelism) a submitted job may have",
                            minimum=1)
    ARTIFACT_UPLOAD = _opt("client.artifact-upload", _parse_str,
                           "how a client stores a job's artifact: auto (through the AppMaster's REST API, else into "
                           "the storage dir), appmaster, or storage", choices=("auto", "appmaster", "storage"))
    BLOB_CACHE_MAX_SIZE = _opt("blob.cache.max-size", parse_size_bytes,
                               "job artifacts a TaskExecutor keeps unpacked at most (0: no bound)")
    BLOB_STORAGE_DIR = _opt("blob.storage.directory", _parse_str,
                            "where TaskExecutors keep job artifacts (empty: on YARN the application's local "
                            "folder of the host, shared by its TaskExecutors there; else the TaskExecutor's work dir)")
    BLOB_CLEANUP_INTERVAL = _opt("blob.service.cleanup.interval", parse_duration_ms,
                                 "a TaskExecutor deletes a job artifact unused for this long")
    TM_REGISTRATION_TIMEOUT = _opt("taskmanager.registration.timeout", parse_duration_ms,
                                   "TaskExecutor exits after this long without a ResourceManager")
    ARROW_ALLOCATOR = _opt("process.memory.arrow-allocator", _parse_str,
                           "Arrow's allocator in AppMaster and TaskExecutor processes",
                           choices=("system", "mimalloc", "jemalloc"))
    MALLOC_ARENA_MAX = _opt("process.memory.malloc-arena-max", _parse_int,
                            "glibc malloc arenas per AppMaster / TaskExecutor process (0: glibc's default)",
                            minimum=0)
    DEFER_PANDAS = _opt("process.memory.defer-pandas-import", _parse_bool,
                        "pyarrow in AppMaster / TaskExecutor processes imports pandas only once user code does")
    BUFFERS_PER_CHANNEL = _opt("taskmanager.network.buffers-per-channel", _parse_int,
                               "batches a producer queues per subpartition before its writes wait "
                               "(back-pressure)", minimum=1)
    EXCLUSIVE_BUFFERS = _opt("taskmanager.network.memory.buffers-per-channel", _parse_int,
                             "exclusive network buffers (credit) of each remote input channel", minimum=1)
    FLOATING_BUFFERS = _opt("taskmanager.network.memory.floating-buffers-per-gate", _parse_int,
                            "network buffers an input gate lends to its channels with a backlog", minimum=0)
    SEGMENT_SIZE = _opt("taskmanager.memory.segment-size", parse_size_bytes,
                        "size of a network buffer: a batch takes one credit per segment started", minimum=1024)
    DEBLOAT_ENABLED = _opt("taskmanager.network.memory.buffer-debloat.enabled", _parse_bool,
                           "size the in-flight data of each input gate to what its task processes in the target "
                           "time (buffer debloating)")
    DEBLOAT_TARGET = _opt("taskmanager.network.memory.buffer-debloat.target", parse_duration_ms,
                          "buffer debloating: the time the in-flight data in front of a task should take it")
    DEBLOAT_PERIOD = _opt("taskmanager.network.memory.buffer-debloat.period", parse_duration_ms,
                          "buffer debloating: how often a task measures its throughput", minimum=10)
    DEBLOAT_SAMPLES = _opt("taskmanager.network.memory.buffer-debloat.samples", _parse_int,
                           "buffer debloating: periods the measured throughput is averaged over", minimum=1)
    DEBLOAT_THRESHOLD = _opt("taskmanager.network.memory.buffer-debloat.threshold-percentages", _parse_int,
                             "buffer debloating: announce a new buffer size only when it differs from the last by "
                             "more than this", minimum=0)
    MIN_SEGMENT_SIZE = _opt("taskmanager.network.memory.min-segment-size", parse_size_bytes,
                            "buffer debloating: the smallest buffer size it sets", minimum=256)
    HA_TYPE = _opt("high-availability.type", _parse_str, "none or zookeeper",
                   choices=("none", "zookeeper"))
    HA_STORAGE_DIR = _opt("high-availability.storageDir", _parse_str, "fsspec URL for job data")
    HA_CLUSTER_ID = _opt("high-availability.cluster-id", _parse_str, "cluster id")
    ZK_QUORUM = _opt("high-availability.zookeeper.quorum", _parse_str, "ZooKeeper hosts")
    ZK_ROOT = _opt("high-availability.zookeeper.path.root", _parse_str, "ZooKeeper root path")
    ZK_SESSION_TIMEOUT = _opt("high-availability.zookeeper.client.session-timeout", parse_duration_ms,
                              "a ZooKeeper session (and the leadership it holds) ends this long after its "
                              "client was last heard")
    ZK_CONNECTION_TIMEOUT = _opt("high-availability.zookeeper.client.connection-timeout", parse_duration_ms,
                                 "give up connecting to ZooKeeper after this long")
    ZK_RETRY_WAIT = _opt("high-availability.zookeeper.client.retry-wait", parse_duration_ms,
                         "wait between retries of a ZooKeeper operation")
    ZK_MAX_RETRY_ATTEMPTS = _opt("high-availability.zookeeper.client.max-retry-attempts", _parse_int,
                                 "retries of a ZooKeeper operation", minimum=0)
    ZK_TOLERATE_SUSPENDED = _opt("high-availability.zookeeper.client.tolerate-suspended-connections", _parse_bool,
                                 "keep leadership while the ZooKeeper connection is suspended (until the "
                                 "session is lost)")
    HA_KEEP_TASKS = _opt("high-availability.keep-running-tasks", _parse_bool,
                         "TaskExecutors keep running a job's tasks when the leader changes; the new leader's "
                         "JobMaster adopts those it finds consistent instead of restarting the job")
    JOB_RESULT_RETENTION = _opt("job-result-store.retention", parse_duration_ms,
                                "with high availability: keep a job's result this long when no client "
                                "fetches it")
    TMP_DIRS = _opt("io.tmp.dirs", _parse_str, "local working directories, comma-separated (the first holds the "
                    "default storage dir; spill files go to each in turn)")
    JM_MEMORY = _opt("jobmanager.memory.process.size", parse_size_bytes, "AppMaster container memory (YARN)")
    WATERMARK_INTERVAL = _opt("pipeline.auto-watermark-interval", parse_duration_ms,
                              "how often a custom watermark generator's on_periodic_emit is called", minimum=1)
    PYTHON_VECTORIZE = _opt("python.row-functions.vectorize", _parse_bool,
                            "run per-row map/filter functions that are plain column expressions (lookups, "
                            "constants, arithmetic, comparisons) as Arrow compute on whole batches")
    PYTHON_EXECUTION_MODE = _opt("python.execution-mode", _parse_str,
                                 "where per-row map/filter/flat_map functions run: process (a Python worker "
                                 "process per task, so a TaskExecutor's slots use a core each) or thread (on the "
                                 "task's thread, sharing the TaskExecutor's GIL)", choices=("process", "thread"))
    PYTHON_WORKER_START_AFTER = _opt("python.worker.start-after", parse_duration_ms,
                                     "per-row time a task spends on its own thread before it starts its Python "
                                     "worker (small jobs never start one)")
    PYTHON_EXECUTABLE = _opt("python.executable", _parse_str,
                             "Python of YARN containers (empty: the shipped venv's, else the client's)")
    YARN_APP_NAME = _opt("yarn.application.name", _parse_str, "YARN application name (empty: yarnflow + job)")
    YARN_QUEUE = _opt("yarn.application.queue", _parse_str, "YARN queue")
    YARN_TAGS = _opt("yarn.tags", _parse_str, "comma-separated YARN application tags")
    YARN_ATTEMPTS = _opt("yarn.application-attempts", _parse_int, "AppMaster attempts (a new attempt recovers "
                         "its jobs only with ZooKeeper high availability)", minimum=1)
    YARN_AM_VCORES = _opt("yarn.appmaster.vcores", _parse_int, "AppMaster container vcores", minimum=1)
    YARN_SHIP_ARCHIVES = _opt("yarn.ship-archives", _parse_str,
                              "comma-separated archives (zip, tar.gz) unpacked in every container")
    YARN_SHIP_VENV = _opt("yarn.ship-venv", _parse_bool, "pack the client's virtual environment (venv-pack) "
                          "and run every container in it")
    YARN_MAX_FAILED_CONTAINERS = _opt("yarn.maximum-failed-containers", _parse_int,
                                      "TaskExecutor containers that may fail before the application fails",
                                      minimum=0)
    YARN_APPLICATION_ID = _opt("yarn.application.id", _parse_str, "the YARN session to use")
    YARN_STAGING_DIR = _opt("yarn.staging-directory", _parse_str,
                            "shared fsspec URL for job artifacts when high-availability.storageDir is unset")
    SPARK_MASTER = _opt("spark.master", _parse_str, "Spark master URL")
    SPARK_EXECUTORS = _opt("spark-stages.executors", _parse_str,
                           "where Spark stages run Spark when spark.master is empty: taskexecutor (local[N] in the "
                           "TaskExecutor), cluster (a Spark standalone master and workers the AppMaster starts: YARN "
                           "containers of the application, or local processes) or auto (cluster on YARN, else "
                           "taskexecutor)", choices=("auto", "taskexecutor", "cluster"))
    SPARK_IDLE_TIMEOUT = _opt("spark-stages.idle-timeout", parse_duration_ms,
                              "the AppMaster stops its Spark master and workers after this long without a stage")
    SPARK_START_TIMEOUT = _opt("spark-stages.start-timeout", parse_duration_ms,
                               "a Spark stage fails when the Spark master it asked for is not up within this time")


OPTIONS: dict[str, ConfigOption[Any]] = {
    o.key: o for cls in Options.__mro__ for o in vars(cls).values() if isinstance(o, ConfigOption)
}
PASSTHROUGH_PREFIXES = ("spark.",)

# Keys (or key prefixes, ending in ".") that are accepted but have no effect yet -> why. A value
# other than the shipped default is refused. Remove an entry when its feature lands.
NOT_SUPPORTED_YET: dict[str, str] = {}


def _default_yaml() -> dict[str, Any]:
    """The shipped defaults (a copy: callers may change it). Parsed once per process: PyYAML's
    pure-Python parser takes ~40 ms over this file, and a local run loads a configuration
    several times."""
    return dict(_parsed_defaults())


@functools.lru_cache(maxsize=1)
def _parsed_defaults() -> dict[str, Any]:
    text = resources.files("yarnflow.conf").joinpath("yarnflow.yaml").read_text(encoding="utf-8")
    return _safe_load(text) or {}


def _safe_load(text: Any) -> Any:
    """``yaml.safe_load``, with libyaml's parser when PyYAML was built with it (same result,
    ~10x faster)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader


@functools.lru_cache(maxsize=1)
def _typed_defaults() -> dict[str, Any]:
    return {key: OPTIONS[key].convert(raw) for key, raw in _default_yaml().items() if key in OPTIONS}


def _not_supported_yet(key: str) -> str | None:
    """Why ``key`` has no effect yet, or None when it works."""
    if key in NOT_SUPPORTED_YET:
        return NOT_SUPPORTED_YET[key]
    return next((why for k, why in NOT_SUPPORTED_YET.items() if k.endswith(".") and key.startswith(k)), None)


def parse_dynamic_properties(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b = x"]`` -> ``{"a": "1", "b": "x"}``; raises on an entry with no ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"bad -D argument {pair!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


class Configuration:
    """An immutable set of typed option values. ``conf[Options.X]`` gives the typed value."""

    def __init__(self, values: Mapping[str, Any], raw: Mapping[str, str], explicit: Iterable[str] = ()) -> None:
        self._values = dict(values)
        self._raw = dict(raw)
        self._explicit = frozenset(explicit)  # keys given by a file or an override, not defaults

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None, *, conf_file: str | None = None,
             source: str = "-D") -> Configuration:
        """Defaults, then ``conf_file`` (or $YARNFLOW_CONF_DIR/yarnflow.yaml), then overrides."""
        layers: list[tuple[str, Mapping[str, Any]]] = [("defaults", _default_yaml())]
        path = conf_file or (os.path.join(os.environ["YARNFLOW_CONF_DIR"], "yarnflow.yaml")
                             if os.environ.get("YARNFLOW_CONF_DIR") else None)
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    data = _safe_load(fh) or {}
            except OSError as exc:
                raise ConfigurationError(f"cannot read configuration file {path}: {exc}") from None
            except yaml.YAMLError as exc:
                raise ConfigurationError(f"configuration file {path} is not valid YAML: {exc}") from None
            if not isinstance(data, dict):
                raise ConfigurationError(f"configuration file {path} must be a mapping of keys to values")
            layers.append((path, data))
        if overrides:
            layers.append((source, overrides))
        merged: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for name, layer in layers:
            for key, value in layer.items():
                merged[str(key)] = value
                origin[str(key)] = name
        return cls._build(merged, origin, {k for k, o in origin.items() if o != "defaults"})

    @classmethod
    def _build(cls, merged: Mapping[str, Any], origin: Mapping[str, str], explicit: Iterable[str] = ()
               ) -> Configuration:
        values: dict[str, Any] = {}
        raw: dict[str, str] = {}
        for key, value in merged.items():
            option = OPTIONS.get(key)
            if option is None:
                if key.startswith(PASSTHROUGH_PREFIXES):
                    values[key] = raw[key] = _parse_str(value)
                    continue
                hint = difflib.get_close_matches(key, list(OPTIONS), n=1)
                extra = f"; did you mean '{hint[0]}'?" if hint else ""
                raise ConfigurationError(
                    f"unknown configuration key '{key}' (from {origin.get(key, '?')}){extra}")
            try:
                values[key] = option.convert(value)
            except ValueError as exc:
                raise ConfigurationError(
                    f"bad value {value!r} for configuration key '{key}' "
                    f"(from {origin.get(key, '?')}): {exc}") from None
            raw[key] = _parse_str(value)
        for key, value in values.items():
            why = _not_supported_yet(key)
            if why is not None and (key not in OPTIONS or value != _typed_defaults().get(key)):
                raise ConfigurationError(
                    f"{key}: not supported yet ({why}; leave it unset); "
                    f"got {merged[key]!r} from {origin.get(key, '?')}")
        missing = set(OPTIONS) - set(values)
        if missing:
            raise ConfigurationError(f"no value for configuration keys: {', '.join(sorted(missing))}")
        return cls(values, raw, explicit)

    def __getitem__(self, option: ConfigOption[T]) -> T:
        return self._values[option.key]  # type: ignore[no-any-return]

    def get(self, key: str) -> Any:
        if key not in self._values:
            raise ConfigurationError(f"unknown configuration key '{key}'")
        return self._values[key]

    def with_overrides(self, overrides: Mapping[str, Any], source: str = "-D") -> Configuration:
        merged: dict[str, Any] = dict(self._raw)
        origin = {k: "base" for k in merged}
        for k, v in overrides.items():
            merged[k] = v
            origin[k] = source
        return self._build(merged, origin, self._explicit | set(overrides))

    def is_set(self, option: ConfigOption[Any]) -> bool:
        """The option was given (a configuration file, -D, an override), not left at its default."""
        return option.key in self._explicit

    def to_strings(self) -> dict[str, str]:
        """The configuration as ``key -> string``: ships to another process as -D pairs."""
        return dict(self._raw)

    def spark_conf(self) -> dict[str, str]:
        return {k: v for k, v in self._raw.items() if k.startswith("spark.")}


def taskexecutor_cores(config: Configuration) -> float:
    """A TaskExecutor's cores (its YARN container's vcores): ``taskmanager.cpu.cores``, or one per
    slot when that is empty (Flink's default)."""
    return config[Options.TM_CPU] or float(config[Options.NUM_SLOTS])
