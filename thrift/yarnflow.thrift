// yarnflow RPC interface: the calls between the client, the AppMaster's components
// (Dispatcher, ResourceManager, JobMasters) and the TaskExecutors.
//
// The Python generated from this file lives in common/rpc/gen/ and is imported only by
// common/rpc/. Regenerate with `python -m yarnflow.common.rpc.codegen` after editing.
//
// Fencing: every call a leader makes on a follower, or a follower makes on a leader's
// component, carries the leader session id of the component it addresses ("fencing token").
// A call with a stale token is refused with RpcError(kind=FENCING), so a deposed AppMaster or a
// TaskExecutor that talks to an old one can do no harm.

namespace py yarnflow_rpc

enum ErrorKind {
  INTERNAL = 0,
  FENCING = 1,         // stale or wrong fencing token
  NOT_FOUND = 2,       // unknown job / task / allocation
  INVALID = 3,         // the request itself is bad (e.g. a malformed JobGraph)
  UNAVAILABLE = 4,     // the component is shutting down or not yet ready
  REFUSED = 5,         // understood and valid, but declined (e.g. slot already taken)
  NOT_LEADER = 6,      // a standby AppMaster (or one that lost the leadership): ask the leader
}

exception RpcError {
  1: ErrorKind kind,
  2: string message,
  3: optional string remote_traceback,
}

enum ExecutionState {
  CREATED = 0, SCHEDULED = 1, DEPLOYING = 2, INITIALIZING = 3, RUNNING = 4,
  FINISHED = 5, CANCELING = 6, CANCELED = 7, FAILED = 8,
  RECONCILING = 9,                 // a new JobMaster leader learns whether the task still runs
}

enum JobStatus {
  INITIALIZING = 0, CREATED = 1, RUNNING = 2, FAILING = 3, FAILED = 4,
  CANCELLING = 5, CANCELED = 6, FINISHED = 7, RESTARTING = 8, SUSPENDED = 9,
}

// Flink's partitioners: SHUFFLE a random subtask per record, RESCALE round-robin over a subset
// of the consumers (pointwise), GLOBAL every record to subtask 0, CUSTOM the user's
// Partitioner picks a subtask per record (it runs in the producer's chain)
enum Partitioner { FORWARD = 0, HASH = 1, REBALANCE = 2, BROADCAST = 3, SHUFFLE = 4, RESCALE = 5, GLOBAL = 6,
                   CUSTOM = 7 }
enum ExchangeMode { PIPELINED = 0, BLOCKING = 1, BLOCKING_PERSISTENT = 2 }  // persistent: in the job storage dir

struct ResourceProfile {
  1: double cpu_cores,
  2: i64 memory_mb,
}

struct ErrorInfo {
  1: string error_class,
  2: string message,
  3: string traceback,        // the remote traceback, formatted; may be empty
  4: optional string location, // e.g. "taskexecutor te-1 (pid 123) / map (1/2)"
  // Set when the task failed because it could not read this result partition (its producer's
  // TaskExecutor does not serve it, released it, or cannot be reached): a ResultPartitionID,
  // "<job id>.<producer attempt id>.<edge index>".
  5: optional string unavailable_partition,
}

// ---- JobGraph ---------------------------------------------------------------------------

struct JobVertex {
  1: string vertex_id,
  2: string name,
  3: i32 parallelism,
  4: i32 max_parallelism,
  5: list<string> operator_names,  // the chained operators, head first
  6: string slot_sharing_group,
  7: ResourceProfile resources,
  8: bool is_source,
  9: bool is_sink,
  10: list<string> operator_uids,  // the chained operators' stable uids (uid() or generated), head first
  11: bool dynamic_parallelism,     // BATCH, adaptive: parallelism decided from its inputs' bytes, up to `parallelism`
}

struct JobEdge {
  1: string source_vertex_id,
  2: string target_vertex_id,
  3: Partitioner partitioner,
  4: ExchangeMode exchange_mode,
  5: list<string> key_columns,    // for HASH
  6: i32 input_index,             // which input of the target (0 for one-input operators)
  7: string output_tag,            // "" for the main output, else the side output's tag
}

struct JobGraph {
  1: string job_id,
  2: string name,
  3: list<JobVertex> vertices,    // topologically sorted
  4: list<JobEdge> edges,
  5: string artifact_uri,         // the job artifact (zip) holding the pickled operator chains
  6: string artifact_sha256,
  7: map<string, string> config,  // job-level configuration overrides
  8: string runtime_mode,         // STREAMING | BATCH
}

// ---- Dispatcher --------------------------------------------------------------------------

// A subtask's I/O figures (Flink's task metrics): totals since the attempt started and rates
// over the last seconds, measured at the task's boundaries (its input gate and record writers).
struct TaskMetrics {
  1: i64 records_in,
  2: i64 records_out,
  3: i64 bytes_in,
  4: i64 bytes_out,
  5: double records_in_per_second,
  6: double records_out_per_second,
  7: double bytes_in_per_second,
  8: double bytes_out_per_second,
  9: double busy_ms_per_second,          // busyTimeMsPerSecond
  10: double backpressured_ms_per_second, // backPressuredTimeMsPerSecond
  11: double idle_ms_per_second,          // idleTimeMsPerSecond
  12: list<i64> operator_records_in,      // per operator of the chain, head first
  13: list<i64> operator_records_out,
  14: i64 managed_memory_bytes,           // the task's operators' share of their slot's managed memory
  15: i64 managed_memory_used,            // what they hold of it now
  16: i64 managed_memory_peak,            // the most they held at once
  17: i64 spilled_bytes,                  // spilledBytes: written to spill files by batch operators
  18: i64 inflight_bytes_peak,            // the most bytes one remote input channel held (<= its credit x segment size)
  19: list<string> operator_paths,        // per operator: how its user function runs ("" for none), see Operator.execution_path
  20: list<i64> result_bytes,             // per result partition (the task's outputs, in order): bytes written
  21: i64 input_watermark,                // currentInputWatermark: the least of its inputs' (none yet: i64 min)
  22: i64 output_watermark,               // currentOutputWatermark: the last it emitted (none yet: i64 min)
  23: i64 late_records_dropped,           // numLateRecordsDropped by its window operators
  24: i64 busy_ms_total,                  // accumulated-busy-time since the task started
  25: i64 backpressured_ms_total,
  26: i64 idle_ms_total,
  27: map<string, double> operator_gauges,  // a connector's own, by Flink's name under its operator ("events.KafkaSourceReader.topic.t.partition.0.currentOffset")
}

struct CheckpointCounts {
  1: i32 completed,
  2: i32 failed,
  3: i32 in_progress,
}

struct VertexStatus {
  1: string vertex_id,
  2: string name,
  3: i32 parallelism,
  4: map<ExecutionState, i32> state_counts,
  5: list<i32> subtask_attempts,   // current attempt number of each subtask (0: never restarted)
  6: list<string> subtask_locations, // TaskExecutor of each subtask's current attempt ("" if none)
  7: list<ExecutionState> subtask_states,  // state of each subtask's current attempt
  8: list<TaskMetrics> subtask_metrics,    // the latest figures of each subtask's current attempt
  9: list<map<ExecutionState, i64>> subtask_timestamps,  // when each subtask's current attempt entered each state (ms)
}

struct FailureEntry {
  1: i64 timestamp_ms,
  2: string task,                  // the failed subtask ("" for a job-level failure)
  3: ErrorInfo error,
  4: i32 restarted_subtasks,       // how many subtasks the failover restarted (0: none, gave up)
  5: i64 restored_checkpoint_id,   // the checkpoint the restarted subtasks resumed from (0: none)
}

// One checkpoint as `yarnflow info` lists it.
struct CheckpointInfo {
  1: i64 checkpoint_id,
  2: string status,                // PENDING | FINALIZING | COMPLETED | ABORTED
  3: i64 trigger_time_ms,
  4: i64 duration_ms,
  5: i64 size_bytes,
  6: i64 alignment_ms,             // longest barrier alignment of any task
  7: string failure,               // why it was aborted ("" otherwise)
  8: bool unaligned,               // some task took it unaligned
  9: i64 inflight_bytes,           // in-flight data persisted by its tasks (unaligned)
  10: i32 num_subtasks,            // the tasks that must acknowledge it
  11: i32 num_acknowledged,
  12: bool is_savepoint,           // taken on a user's request into a savepoint folder
  13: string external_path,        // its folder once written (a savepoint's folder)
  14: bool discarded,              // completed, no longer retained: its files are deleted
  15: i64 start_delay_ms,          // longest start delay of any task (trigger to its first barrier)
}

struct JobStatusInfo {
  1: string job_id,
  2: string name,
  3: JobStatus status,
  4: i64 start_time_ms,
  5: i64 end_time_ms,             // 0 while running
  6: list<VertexStatus> vertices,
  7: optional ErrorInfo failure_cause,
  8: i64 all_running_time_ms,      // when every subtask first reported RUNNING (0: not yet)
  9: list<FailureEntry> failure_history,
  10: string restart_strategy,     // e.g. "fixed-delay: 1 of 3 attempts used"
  11: list<CheckpointInfo> checkpoints,  // the latest ones, oldest first (empty: checkpointing off)
  12: i64 latest_completed_checkpoint_id, // 0: none yet
  13: i32 num_restarts,            // restarts of any of the job's subtasks (Flink's numRestarts)
  14: CheckpointCounts checkpoint_counts,
  15: string scaling,              // the adaptive scheduler: its parallelism, the desired one, why it waits ("": none)
}

struct JobResult {
  1: string job_id,
  2: JobStatus status,            // FINISHED, FAILED or CANCELED
  3: i64 start_time_ms,
  4: i64 end_time_ms,
  5: optional ErrorInfo failure_cause,
  6: map<string, list<string>> collected,  // sink uid -> Arrow IPC files of collected results
}

struct ClusterInfo {
  1: string cluster_id,
  2: string storage_dir,          // where clients put job artifacts (fsspec URL)
  3: string version,
  4: i32 registered_taskexecutors,
  5: i32 total_slots,
  6: i32 free_slots,
  7: string target,               // local | yarn
  8: string leader_session_id,    // the Dispatcher's fencing token: send it with every job call
  9: string web_url,              // the REST API and web UI ("" when not served)
}

// Every call that acts on a job (or the cluster) carries the Dispatcher's leader session id,
// as read once from clusterInfo(); a stale one is refused with FENCING.
service DispatcherService {
  string submitJob(1: string fencing_token, 2: JobGraph job_graph) throws (1: RpcError err),
  list<JobStatusInfo> listJobs(1: string fencing_token) throws (1: RpcError err),
  JobStatusInfo getJob(1: string fencing_token, 2: string job_id) throws (1: RpcError err),
  void cancelJob(1: string fencing_token, 2: string job_id) throws (1: RpcError err),
  // Waits up to timeout_ms for the job to reach a terminal state; NOT_FOUND if unknown,
  // UNAVAILABLE if it is still running when the timeout passes.
  JobResult requestJobResult(1: string fencing_token, 2: string job_id, 3: i64 timeout_ms)
      throws (1: RpcError err),
  // Not fenced: this is how a client learns the fencing token.
  ClusterInfo clusterInfo() throws (1: RpcError err),
  void shutdownCluster(1: string fencing_token) throws (1: RpcError err),
  // A savepoint of the running job into a new folder under target_dir (empty: the cluster's
  // state.savepoints.dir); returns the folder's URL once it is complete.
  string triggerSavepoint(1: string fencing_token, 2: string job_id, 3: string target_dir)
      throws (1: RpcError err),
  // Stop-with-savepoint: the job's sources stop, a savepoint is taken (after every timer and
  // window fired, with drain) and the job ends FINISHED; returns the savepoint's URL once it is
  // complete (the job may still be finishing).
  string stopWithSavepoint(1: string fencing_token, 2: string job_id, 3: string target_dir, 4: bool drain)
      throws (1: RpcError err),
  // Rescale the running job: its operators at the job's parallelism go to `parallelism`. The job
  // stops at a consistent point (sinks commit), its state is dealt to the new parallelism and it
  // runs on under the same id; returns the new parallelism once the job runs with it.
  i32 rescaleJob(1: string fencing_token, 2: string job_id, 3: i32 parallelism) throws (1: RpcError err),
  // run this many TaskExecutors from now on (yarnflow session scale); answers the count
  i32 scaleSession(1: string fencing_token, 2: i32 taskexecutors) throws (1: RpcError err),
}

// ---- ResourceManager ---------------------------------------------------------------------

struct SlotStatus {
  1: i32 slot_index,
  2: ResourceProfile profile,
  3: optional string allocation_id,
  4: optional string job_id,
}

// A TaskExecutor's memory as its watchdog last measured it (worker/memory/watchdog.py)
struct MemoryStatus {
  1: i64 used_bytes,               // resident memory of the process and its children
  2: i64 peak_bytes,
  3: i64 limit_bytes,              // taskmanager.memory.process.size
  4: i64 arrow_bytes,              // Arrow's memory pool
  5: i64 managed_total_bytes,
  6: i64 managed_used_bytes,       // reserved by operators and shared RocksDB memory
  7: i64 rocksdb_bytes,            // the shared RocksDB block caches hold (memtables included)
  8: string level,                 // ok | warning | critical
  9: double cpu_load,              // cores the process used since the last measurement
}

struct SlotReport {
  1: list<SlotStatus> slots,
  2: i32 blocking_partitions,      // partitions held for consumers: not idle even with free slots
  3: optional MemoryStatus memory,
}

struct TaskExecutorRegistration {
  1: string resource_id,
  2: string rpc_address,          // host:port of its TaskExecutorService
  3: string data_address,         // host:port of its Arrow Flight data server
  4: i32 num_slots,
  5: ResourceProfile slot_profile,
  6: i64 pid,
  7: string hostname,
  8: string metrics_address = "",  // host:port of its Prometheus endpoint ("": no metrics reporter)
  9: string container_id = "",     // the worker (process group or YARN container) it runs in, with its other
                                   // slot processes ("": its own; taskmanager.slot-processes)
}

struct RegistrationResponse {
  1: bool accepted,
  2: string fencing_token,        // the ResourceManager's leader session id
  3: string registration_id,
  4: i64 heartbeat_interval_ms,
  5: string reason,               // why it was declined
}

service ResourceManagerService {
  RegistrationResponse registerTaskExecutor(1: TaskExecutorRegistration registration)
      throws (1: RpcError err),
  // Sent every heartbeat.interval; an unknown registration gets REFUSED (re-register).
  void heartbeatFromTaskExecutor(1: string fencing_token, 2: string registration_id,
                                 3: SlotReport slot_report) throws (1: RpcError err),
  void disconnectTaskExecutor(1: string fencing_token, 2: string resource_id,
                              3: string reason) throws (1: RpcError err),
  // A Spark stage's driver wants Spark: the master's spark:// URL, "local" (run Spark inside
  // the TaskExecutor), or "" while the AppMaster's Spark master starts (ask again).
  string requestSparkMaster(1: string fencing_token, 2: map<string, string> settings) throws (1: RpcError err),
}

// ---- JobMaster ---------------------------------------------------------------------------

struct SlotOffer {
  1: string allocation_id,
  2: i32 slot_index,
  3: ResourceProfile profile,
  4: string registration_id,      // the TaskExecutor's registration at the ResourceManager that allocated it
}

struct TaskExecutionStateUpdate {
  1: string job_id,
  2: string execution_attempt_id,
  3: ExecutionState state,
  4: optional ErrorInfo error,
  5: i64 records_in,
  6: i64 records_out,
  7: optional TaskMetrics metrics,
}

// A split a running source task took from the split enumerator, and the last checkpoint
// barrier the task had emitted when it took it (a master failover keeps it booked there).
struct TakenSplit {
  1: string split_id,
  2: i64 last_checkpoint_id,
}

// One task of a job a TaskExecutor kept running across a change of the AppMaster leader.
struct ReconciledTask {
  1: string execution_attempt_id,
  2: string vertex_id,
  3: i32 subtask_index,
  4: i32 attempt_number,
  5: ExecutionState state,
  6: string allocation_id,
  7: i64 last_acknowledged_checkpoint,
  8: list<TakenSplit> taken_splits,
  9: i64 restored_checkpoint,      // the checkpoint it started from (0: none)
}

// What a TaskExecutor holds of a job, for the job's new JobMaster (reconnectJob).
struct JobReconnectReport {
  1: string resource_id,
  2: list<SlotOffer> slots,
  3: list<ReconciledTask> tasks,
  4: list<TaskExecutionStateUpdate> final_updates,  // ended tasks not yet acknowledged
}

struct SourceSplit {
  1: string split_id,
  2: binary payload,               // the source's own description of the split (pickled)
}

struct SplitResponse {
  1: optional SourceSplit split,   // unset: no split right now
  2: bool no_more_splits,          // the source subtask may finish
}

// Sent by a TaskExecutor every heartbeat.interval to the JobMaster of each job it holds slots for.
struct TaskExecutorHeartbeatPayload {
  1: string resource_id,
  // Every task of the job on this TaskExecutor in its current state, and the final update of
  // each ended task that the JobMaster has not acknowledged yet.
  2: list<TaskExecutionStateUpdate> executions,
  3: list<string> allocation_ids,   // the slots this TaskExecutor holds for the job
}

// A thread of a process and where it is (the REST API's thread dumps: Flink's ThreadInfo).
struct ThreadInfo {
  1: string name,
  2: i64 ident,
  3: bool daemon,
  4: double cpu_seconds,         // the CPU time the thread used so far (-1: not known)
  5: list<string> frames,        // its stack, outermost first, as Python's traceback prints it
}

// Identical samples of a task's thread (flame graphs: Flink's ThreadInfoSample, counted).
struct ThreadInfoSample {
  1: i32 subtask_index,
  2: bool on_cpu,                // the thread used the CPU for most of the time up to the sample
  3: list<string> frames,        // "module.function:line", outermost first
  4: i32 count,                  // how many samples had this subtask, on_cpu and stack
}

// The JobMaster's answer: the slots it holds on that TaskExecutor. The TaskExecutor frees every
// active slot of the job that is not listed (Flink's AllocatedSlotReport).
struct AllocatedSlotReport {
  1: list<string> allocation_ids,
}

// ---- Checkpoints ------------------------------------------------------------------------

// One file of one operator's state in a checkpoint (Arrow IPC; any fsspec URL).
struct OperatorStateFile {
  1: i32 operator_index,           // the operator's position in the task's chain (head = 0)
  2: string name,                  // which piece of the operator's state ("keyed", "splits", ...)
  3: string path,
  4: i64 size_bytes,
}

struct TaskStateSnapshot {
  1: list<OperatorStateFile> files,
  2: i64 alignment_ms,             // from the first barrier to the last (exactly-once)
  3: i64 sync_ms,                  // how long the task paused to take a consistent copy
  4: i64 async_ms,                 // writing the files, in the background
  5: bool unaligned,               // taken before every barrier came (unaligned checkpoint)
  6: i64 inflight_bytes,           // bytes of in-flight data it persisted (unaligned)
  7: i64 start_delay_ms,           // from the trigger to the task's first barrier (Flink's start delay)
}

// The state a task starts from: the files of its subtask in a completed checkpoint.
struct TaskRestore {
  1: i64 checkpoint_id,
  2: list<OperatorStateFile> files,
  3: bool finished,                // the subtask had finished by then: it emits nothing and ends
}

service JobMasterService {
  // Returns the offers the JobMaster accepted; the TaskExecutor frees the others.
  list<SlotOffer> offerSlots(1: string fencing_token, 2: string job_id, 3: string resource_id,
                             4: list<SlotOffer> offers) throws (1: RpcError err),
  bool updateTaskExecutionState(1: string fencing_token, 2: TaskExecutionStateUpdate update)
      throws (1: RpcError err),
  // A source subtask asks for its next split (dynamic split assignment, as in Flink's FLIP-27).
  // last_checkpoint_id: the last checkpoint barrier the subtask emitted (0: none), so the
  // enumerator knows which checkpoint's source state will hold the split.
  SplitResponse requestSplit(1: string fencing_token, 2: string job_id, 3: string vertex_id,
                             4: i32 subtask_index, 5: string execution_attempt_id,
                             6: i64 last_checkpoint_id) throws (1: RpcError err),
  // A task wrote its snapshot for a checkpoint (the files are Arrow IPC under chk-<n>/).
  void acknowledgeCheckpoint(1: string fencing_token, 2: string job_id, 3: string execution_attempt_id,
                             4: i64 checkpoint_id, 5: TaskStateSnapshot snapshot) throws (1: RpcError err),
  // A task could not take its snapshot: the checkpoint is aborted.
  void declineCheckpoint(1: string fencing_token, 2: string job_id, 3: string execution_attempt_id,
                         4: i64 checkpoint_id, 5: string reason) throws (1: RpcError err),
  // The job's artifact, as Flink's BlobServer serves it: up to `length` bytes from `offset`
  // (fewer at its end, none past it). NOT_FOUND for any other content hash than the job's.
  binary readArtifact(1: string fencing_token, 2: string job_id, 3: string sha256, 4: i64 offset,
                      5: i32 length) throws (1: RpcError err),
  // NOT_FOUND when the job has no JobMaster here (the TaskExecutor then frees the job's slots).
  AllocatedSlotReport heartbeatFromTaskExecutor(1: string fencing_token, 2: string job_id,
                                                3: TaskExecutorHeartbeatPayload payload)
      throws (1: RpcError err),
}

// ---- TaskExecutor ------------------------------------------------------------------------

struct InputChannelDescriptor {
  1: string partition_id,         // the producer's result partition
  3: string producer_resource_id,
  4: string producer_data_address,
}

// The channels of one input edge. Every channel reads the same subpartition index of its
// producer's partition (the consumer's index on an all-to-all edge, 0 on a forward edge), so
// all consumers of an all-to-all edge share one channel list (deployment stays linear).
struct InputGateDescriptor {
  1: i32 input_index,
  2: list<InputChannelDescriptor> channels,
  3: i32 subpartition_index,
  4: ExchangeMode exchange_mode,   // BLOCKING_PERSISTENT: read from the job storage dir, not from the producer
  5: i32 subpartition_end,         // > 0: read subpartitions [subpartition_index, subpartition_end) of each channel
  6: list<string> key_columns,     // a keyed (hash) input: its key columns (a restore redistributes in-flight rows by them)
}

struct ResultPartitionDescriptor {
  1: string partition_id,
  2: i32 num_subpartitions,
  3: Partitioner partitioner,
  4: list<string> key_columns,
  5: ExchangeMode exchange_mode,
  6: i32 consumer_max_parallelism,
  7: string output_tag,            // "" for the main output, else the side output's tag
}

struct TaskDeploymentDescriptor {
  1: string job_id,
  2: string vertex_id,
  3: string task_name,
  4: string execution_attempt_id,
  5: i32 subtask_index,
  6: i32 attempt_number,
  7: i32 parallelism,
  8: i32 max_parallelism,
  9: string allocation_id,
  10: string artifact_uri,
  11: string artifact_sha256,
  12: list<InputGateDescriptor> input_gates,
  13: list<ResultPartitionDescriptor> result_partitions,
  14: string jobmaster_fencing_token,
  15: map<string, string> config,
  16: string runtime_mode,
  17: string job_storage_dir,     // per-job dir on the storage filesystem (collect results...)
  18: string checkpoint_dir,      // <checkpoints dir>/<job id> ("" when checkpointing is off)
  19: optional TaskRestore restore, // state to restore before the task runs
  20: string job_name,
}

service TaskExecutorService {
  // From the ResourceManager: reserve slot_index for allocation_id of job_id and offer it
  // to that job's JobMaster.
  void requestSlot(1: string rm_fencing_token, 2: i32 slot_index, 3: string job_id,
                   4: string allocation_id, 5: ResourceProfile profile,
                   6: string jobmaster_address, 7: string jobmaster_fencing_token)
      throws (1: RpcError err),
  void submitTask(1: string jobmaster_fencing_token, 2: TaskDeploymentDescriptor tdd)
      throws (1: RpcError err),
  void cancelTask(1: string jobmaster_fencing_token, 2: string execution_attempt_id)
      throws (1: RpcError err),
  void freeSlot(1: string jobmaster_fencing_token, 2: string allocation_id, 3: string reason)
      throws (1: RpcError err),
  void disconnectResourceManager(1: string rm_fencing_token, 2: string reason)
      throws (1: RpcError err),
  // Release the job's blocking result partitions held here (all of them when the list is empty).
  void releasePartitions(1: string jobmaster_fencing_token, 2: string job_id,
                         3: list<string> partition_ids) throws (1: RpcError err),
  // Checkpoints: the JobMaster triggers them at the source tasks (which send barriers
  // downstream), and tells every task when one completed (sinks commit) or was aborted.
  // stop_mode: "" for a checkpoint; "stop" / "drain" for the savepoint of stop-with-savepoint
  // (the sources stop after it; with "drain" they end their input first).
  void triggerCheckpoint(1: string jobmaster_fencing_token, 2: string execution_attempt_id,
                         3: i64 checkpoint_id, 4: i64 timestamp_ms, 5: bool exactly_once,
                         6: string stop_mode = "", 7: i64 aligned_timeout_ms = -1) throws (1: RpcError err),
  void notifyCheckpointComplete(1: string jobmaster_fencing_token, 2: string execution_attempt_id,
                                3: i64 checkpoint_id) throws (1: RpcError err),
  void notifyCheckpointAborted(1: string jobmaster_fencing_token, 2: string execution_attempt_id,
                               3: i64 checkpoint_id) throws (1: RpcError err),
  // From a new leader's JobMaster of job_id (fenced by the new leader's ResourceManager
  // token): the job's slots and tasks here now answer to that JobMaster; what they hold.
  JobReconnectReport reconnectJob(1: string rm_fencing_token, 2: string job_id,
                                  3: string jobmaster_address, 4: string jobmaster_fencing_token)
      throws (1: RpcError err),
  // Every thread of this process with its stack (REST: /taskmanagers/:id/thread-dump).
  list<ThreadInfo> requestThreadDump() throws (1: RpcError err),
  // Flame graphs: num_samples samples, delay_ms apart, of the threads of job_id's vertex_id
  // subtasks running here (every one of them when subtasks is empty), each cut to its innermost
  // max_depth frames; identical samples counted once.
  list<ThreadInfoSample> requestThreadInfoSamples(1: string job_id, 2: string vertex_id,
      3: list<i32> subtasks, 4: i32 num_samples, 5: i32 delay_ms, 6: i32 max_depth) throws (1: RpcError err),
  // Liveness probe used by tests and tools.
  string ping(),
}
