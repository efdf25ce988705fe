"""The ``cluster.kind`` registry: one ``ClusterKind`` plug-in object per kind, its settings
model and its executor side by side. Adding a kind is one entry here (or, from outside the
package, one ``CLUSTER_KINDS[name] = ClusterKind(...)`` before ``simpipe.config.model`` is
imported: the ``[cluster]`` union is built from this table when the config is).

Imported by ``simpipe validate``: nothing here imports distributed or dask-jobqueue.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Discriminator, Tag

from simpipe.cluster.config import AddressClusterConfig, LocalClusterConfig, SlurmClusterConfig
from simpipe.cluster.plugin import ClusterKind
from simpipe.cluster.slurm_job import reporting_job_class
from simpipe.cluster.workers import AddressWorkers, LocalWorkers, SlurmWorkers

#: ``cluster.kind`` -> its plug-in: the one place that names a kind's settings and executor.
CLUSTER_KINDS: dict[str, ClusterKind[Any]] = {kind.name: kind for kind in (
    ClusterKind(LocalClusterConfig, LocalWorkers),
    ClusterKind(AddressClusterConfig, AddressWorkers),
    ClusterKind(SlurmClusterConfig, SlurmWorkers, job_class=reporting_job_class),
)}
DEFAULT_KIND = "local"
#: The validation error type of a ``kind`` that names no kind (its input is the section).
KIND_ERROR = "cluster_kind"


def _one_of(names: list[str]) -> str:
    """``'a', 'b' or 'c'``, as pydantic lists allowed values."""
    quoted = [repr(name) for name in names]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


def _kind_of(value: Any) -> str | None:
    """The discriminator: ``kind``, ``"local"`` when the section leaves it out."""
    if isinstance(value, dict):
        kind = value.get("kind", DEFAULT_KIND)
        return kind if isinstance(kind, str) else None
    return getattr(value, "kind", None)


def settings_union() -> Any:
    """``[cluster]`` as a type: one of the registered kinds' settings models, chosen by
    ``kind``; a key of another kind is an error naming the key and the kind. Built from
    ``CLUSTER_KINDS`` as it is now (``simpipe.config.model`` builds it once, when imported)."""
    return Annotated[
        Union[tuple(Annotated[k.settings, Tag(name)]  # noqa: UP007 - built from the registry
                    for name, k in CLUSTER_KINDS.items())],
        Discriminator(_kind_of, custom_error_type=KIND_ERROR,
                      custom_error_message=f"Input should be {_one_of(list(CLUSTER_KINDS))}"),
    ]
