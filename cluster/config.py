"""``[cluster]``: where the Dask workers run. Knows nothing of games or personas."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "address"] = "local"
    # local: a distributed.LocalCluster of worker processes on this machine
    workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    memory_limit: str = "auto"  # per worker, e.g. "4GiB"; "auto": RAM / workers
    dashboard_address: str = ":8787"  # "" turns the dashboard off
    # address: an existing scheduler, e.g. "tcp://10.0.0.5:8786"
    address: str | None = None

    @model_validator(mode="after")
    def _address(self) -> "ClusterConfig":
        if self.kind == "address" and not self.address:
            raise ValueError('cluster.kind = "address" needs cluster.address = "tcp://host:port"')
        return self
