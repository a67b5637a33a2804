"""What a job leaves behind, and how an ended job's is removed: its storage dir (collected rows,
Spark reports, stored result partitions, the Spark stages' files) and its high-availability
data (JobGraph, checkpoint pointers, checkpoint id counter)."""

from __future__ import annotations

import logging
import time
import threading

import fsspec

from yarnflow.am.checkpoint.savepoints import SavepointError, read_savepoint, restore_metadata
from yarnflow.am.checkpoint.storage import checkpoints_retained, job_checkpoint_dir
from yarnflow.common.artifacts import artifact_uri
from yarnflow.common.config import Configuration, Options
from yarnflow.common.errors import InvalidRequestError, NotLeaderError
from yarnflow.common.ha import HighAvailabilityServices
from yarnflow.common.ids import JobID
from yarnflow.common.messages import JobGraph
from yarnflow.common.states import JobStatus

log = logging.getLogger(__name__)


def job_storage_dir(storage_dir: str, job_id: str) -> str:
    return f"{storage_dir.rstrip('/')}/jobs/{job_id}"


#: what an ended job's storage dir holds that nobody reads any more: the stored (BLOCKING_PERSISTENT)
#: result partitions and the Spark stages' input and output files. Its collected rows, Spark
#: reports and checkpoints (by their retention) stay.
INTERMEDIATE_DIRS = ("partitions", "intermediate")


def delete_intermediate_data(job_dir: str) -> None:
    """Delete an ended job's intermediate data (``INTERMEDIATE_DIRS`` under its storage dir, on
    any fsspec filesystem); a failure is logged, never raised."""
    for name in INTERMEDIATE_DIRS:
        url = f"{job_dir.rstrip('/')}/{name}"
        try:
            fs, path = fsspec.core.url_to_fs(url)
            if fs.exists(path):
                fs.rm(path, recursive=True)
                log.info("deleted the ended job's %s", url)
        except Exception:  # noqa: BLE001 - any filesystem's error; the data is only garbage now
            log.warning("could not delete %s", url, exc_info=True)


def delete_unreferenced_artifact(ha: HighAvailabilityServices, storage_dir: str, uri: str) -> bool:
    """Delete the job artifact ``uri`` when it is one of ``storage_dir``'s and no job in the
    JobGraphStore (running, or retained for a next leader) references it; True when deleted.
    An artifact stored elsewhere is the user's, and one whose references cannot all be read
    stays."""
    if not uri.startswith(artifact_uri(storage_dir, "")[:-len(".zip")]):
        return False
    store = ha.job_graph_store()
    try:
        if any(store.get(job_id).artifact_uri == uri for job_id in store.job_ids()):
            return False
        fs, path = fsspec.core.url_to_fs(uri)
        fs.rm(path)
    except FileNotFoundError:
        return False
    except Exception:  # noqa: BLE001 - any store's or filesystem's error: it stays, as garbage at worst
        log.warning("could not delete the job artifact %s", uri, exc_info=True)
        return False
    log.info("deleted the job artifact %s: no job references it any more", uri)
    return True


def delete_checkpoints(job_checkpoint_dir: str, attempts: int = 5, settle_s: float = 1.0) -> None:
    """Delete an ended job's checkpoint folder (its retention does not keep it), on a thread of
    the caller's; a failure is logged, never raised. A checkpoint that was in flight when the
    job ended may still be written or discarded meanwhile (its JobMaster's I/O, for a moment):
    a removal that meets files vanishing under it, or files that appear after it, is made again,
    ``settle_s`` later, up to ``attempts`` times."""
    error: Exception | None = None
    for _ in range(attempts):
        try:
            fs, path = fsspec.core.url_to_fs(job_checkpoint_dir)
            if fs.exists(path):
                fs.rm(path, recursive=True)
            time.sleep(settle_s)  # anything written late shows by now
            if not fs.exists(path):
                log.info("deleted the ended job's checkpoints at %s", job_checkpoint_dir)
                return
        except FileNotFoundError as exc:  # removed under it by the JobMaster's discard: again
            error = exc
            time.sleep(settle_s)
        except Exception as exc:  # noqa: BLE001 - any filesystem's error; they are garbage now
            error = exc
            break
    log.warning("could not delete the checkpoints at %s: %r", job_checkpoint_dir, error)


def forget_ended_job(ha: HighAvailabilityServices, storage_dir: str, job_id: JobID,
                     checkpoints: str | None = None) -> bool:
    """Forget the HA data of an ended job (its result stays in the JobResultStore) and delete
    its intermediate data in the job's storage dir, and its ``checkpoints`` folder when given
    (in the background); True when done. A deposed leader forgets nothing: the next leader does."""
    try:
        ha.job_graph_store().remove(job_id)
        ha.checkpoint_store(job_id).clear()
        ha.checkpoint_id_counter(job_id).remove()
    except NotLeaderError as exc:
        log.warning("job %s: its JobGraph and checkpoint pointers stay for the next leader: %s", job_id, exc)
        return False
    def clean_up() -> None:
        delete_intermediate_data(job_storage_dir(storage_dir, job_id))
        if checkpoints:
            delete_checkpoints(checkpoints)

    threading.Thread(target=clean_up, name=f"clean-up-{job_id}", daemon=True).start()
    return True


def check_savepoint(config: Configuration, job_graph: JobGraph) -> None:
    """Refuse (InvalidRequestError) a job that is to start from a savepoint it cannot use, before
    it is accepted; ``config``: the cluster's with the job's overrides."""
    path = str(config[Options.SAVEPOINT_PATH])
    if not path:
        return
    try:
        restore_metadata(read_savepoint(path), job_graph, bool(config[Options.SAVEPOINT_IGNORE_UNCLAIMED]))
    except SavepointError as exc:
        raise InvalidRequestError(str(exc)) from None
    if int(config[Options.CHECKPOINT_INTERVAL]) <= 0:
        raise InvalidRequestError("a job started from a savepoint must take checkpoints: set "
                                  "execution.checkpointing.interval (a STREAMING job)")


def unretained_checkpoints(ha: HighAvailabilityServices, config: Configuration, storage_dir: str, job_id: JobID,
                           status: JobStatus) -> str | None:
    """The checkpoint folder of job ``job_id``, which ended ``status``, when its retention does
    not keep it (as ``JobMaster.checkpoints_to_delete``); None when kept or its JobGraph cannot
    be read. For a new leader that finds a job whose end was recorded but not cleaned up."""
    try:
        graph = ha.job_graph_store().get(job_id)
    except Exception:  # noqa: BLE001 - any store's error: the checkpoints stay, as garbage at worst
        return None
    job_config = config.with_overrides(graph.config)
    if checkpoints_retained(status, str(job_config[Options.CHECKPOINT_RETENTION])):
        return None
    return job_checkpoint_dir(str(job_config[Options.CHECKPOINT_DIR]) or f"{storage_dir.rstrip('/')}/checkpoints",
                              str(job_id))
