"""What a ``cluster.kind`` is: one plug-in object, ``ClusterKind``, that owns the kind's
settings model, its executor (``Workers``: what starts and stops its Dask workers and
connects a client to them) and, for a kind whose workers are batch jobs, its dask-jobqueue
job class. ``simpipe.cluster.kinds.CLUSTER_KINDS`` registers them.

As in dask-jobqueue, where a ``JobQueueCluster`` subclass names its ``Job`` class and its
config section, a kind is declared in one place. Nothing here imports Dask's distributed or
dask-jobqueue: ``simpipe validate`` reads the registry and needs neither (each executor
imports them in ``connect``, the job class is loaded when the workers start).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from simpipe.cluster.config import ClusterSettings

if TYPE_CHECKING:  # distributed is imported when a client is made
    from distributed import Client

S = TypeVar("S", bound=ClusterSettings)
#: Told as the workers come up (``scheduler=``, ``dashboard=``, ``worker_jobs=``): a
#: persistent cluster's manager writes each step to its state file.
Progress = Callable[..., None]
#: Loads a kind's job class on first use (dask-jobqueue is heavy: not at import).
JobClassLoader = Callable[[], type]


def _ignore(**state: Any) -> None:
    """The default ``Progress``: nobody listens."""


class Workers(Generic[S]):
    """A kind's executor: the Dask workers of one entered ``simpipe.run.executor.Executor``,
    typed by the kind's own settings model ``S``. ``connect`` starts the workers (or reaches
    them) and returns a connected client; whatever it starts goes on the ``ExitStack``,
    which the executor closes when it is left.

    ``job_name`` names the batch jobs a kind submits; ``job_class`` is the kind's job class
    where it has one (``ClusterKind.job_class``, loaded)."""

    def __init__(self, settings: S, *, job_name: str, progress: Progress = _ignore,
                 job_class: type | None = None) -> None:
        self.settings = settings
        self.job_name = job_name
        self.progress = progress
        self.job_class = job_class

    def connect(self, stack: ExitStack) -> Client:
        """A connected client; what it started goes on ``stack``."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to connect")

    def worker_jobs(self) -> list[str]:
        """The batch job ids of the workers now; none for a kind without jobs."""
        return []


@dataclass(frozen=True)
class ClusterKind(Generic[S]):
    """One ``cluster.kind``: its settings model (whose ``kind`` default is its name), its
    executor class, and its job class loader where its workers are batch jobs."""

    settings: type[S]
    workers: type[Workers[S]]
    job_class: JobClassLoader | None = None

    @property
    def name(self) -> str:
        return self.settings.model_fields["kind"].default

    def workers_for(self, settings: ClusterSettings, *, job_name: str,
                    progress: Progress = _ignore) -> Workers[S]:
        """This kind's executor for ``settings``, checked to be this kind's model (the
        narrowing that lets each executor use its own keys, typed)."""
        if not isinstance(settings, self.settings):
            raise TypeError(f"cluster.kind {self.name!r} takes {self.settings.__name__}, "
                            f"not {type(settings).__name__}")
        return self.workers(settings, job_name=job_name, progress=progress,
                            job_class=self.job_class() if self.job_class else None)
