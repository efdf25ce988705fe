"""The SLURM kind's job class: dask-jobqueue's ``SLURMJob``, keeping sbatch's refusal.

Loaded on first use (``reporting_job_class``, the SLURM kind's ``ClusterKind.job_class``):
dask-jobqueue is heavy and ``simpipe validate`` reads the kinds' registry without it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from simpipe.cluster.ctrl_c import import_slurm_cluster
from simpipe.cluster.slurm import sbatch_words

#: Where a refused job says so, once (``simpipe.cluster.connect.start_workers`` quiets it
#: while its own error says the same).
SUBMIT_LOGGER = logging.getLogger(__name__)
#: How that warning starts.
REFUSED = "sbatch refused"


@functools.cache
def reporting_job_class() -> type:
    """dask-jobqueue's ``SLURMJob``, keeping sbatch's refusal as ``submit_error``.

    Why: dask-jobqueue raises a refused ``sbatch`` inside its event loop, where nobody
    waits for it (a logged traceback), and leaves the job ``created``: the run then waited
    ``start_timeout_s`` for a worker that could never come and the cluster's close failed
    with ``AssertionError: Status.created``. Here the job is marked failed (which closes
    cleanly), the refusal is one warning line, and ``start_workers`` reports it at once."""
    import_slurm_cluster()  # dask_jobqueue, without its side effect on Ctrl-C
    from dask_jobqueue.slurm import SLURMJob
    from distributed.core import Status

    class ReportingSLURMJob(SLURMJob):
        submit_error: str | None = None

        def __await__(self) -> Any:
            async def started() -> ReportingSLURMJob:
                async with self.lock:
                    if self.status == Status.created:
                        await self.start()
                return self

            return started().__await__()

        async def start(self) -> None:
            try:
                await super().start()
            except (RuntimeError, ValueError, OSError) as exc:  # sbatch failed or said nothing
                words = sbatch_words(str(exc).split("stderr:", 1)[-1])
                self.status = Status.failed
                # Said before it is seen: start_workers's filter is still on.
                SUBMIT_LOGGER.warning(f"{REFUSED} a worker job: %s", words)
                self.submit_error = words

    return ReportingSLURMJob


def refused_jobs(cluster: Any) -> list[str]:
    """sbatch's words for each worker job of ``cluster`` it refused."""
    return [job.submit_error for job in list(cluster.workers.values())
            if getattr(job, "submit_error", None)]
