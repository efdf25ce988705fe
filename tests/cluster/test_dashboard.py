"""The Dask dashboard listens on loopback by default, and `dashboard_address = ""` means no
HTTP server at all: checked on the sockets this process really listens on."""

from __future__ import annotations

import urllib.request
import warnings
from urllib.parse import urlsplit

import psutil
import pytest

from simpipe.cluster.config import (
    AddressClusterConfig,
    LocalClusterConfig,
    SlurmClusterConfig,
)
from simpipe.cluster.connect import slurm_cluster
from simpipe.run.executor import cluster_client


def listening() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def comm_ports(client) -> set[int]:
    """The scheduler's and the nannies' Dask ports (the nannies live in this process)."""
    info = client.scheduler_info(n_workers=-1)
    return {port_of(info["address"])} | {port_of(w["nanny"]) for w in info["workers"].values()}


@pytest.fixture(autouse=True)
def _port_8787_may_be_taken():
    # Someone else's dashboard on 8787 makes distributed pick another port, with a warning.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Port 8787 is already in use", UserWarning)
        yield


def test_default_dashboard_listens_on_loopback_only():
    before = listening()
    with cluster_client(LocalClusterConfig(workers=1)) as client:
        opened = listening() - before
        expected = comm_ports(client)
        link = client.dashboard_link
        with urllib.request.urlopen(link, timeout=30) as resp:
            assert resp.status == 200
    assert {port for _, port in opened} == expected | {urlsplit(link).port}, opened
    assert {ip for ip, _ in opened} == {"127.0.0.1"}, opened


def test_empty_dashboard_address_opens_no_http_server():
    before = listening()
    with cluster_client(LocalClusterConfig(workers=2, dashboard_address="")) as client:
        opened = listening() - before
        expected = comm_ports(client)
        assert client.dashboard_link in ("", None)
        assert client.submit(sum, [1, 2]).result() == 3
    assert {port for _, port in opened} == expected, opened
    assert {ip for ip, _ in opened} == {"127.0.0.1"}


@pytest.mark.slurm
@pytest.mark.parametrize("address", ["", "127.0.0.1:0"])
def test_slurm_scheduler_dashboard_follows_the_config(address, slurm_controller):
    config = SlurmClusterConfig(interface="lo", dashboard_address=address)
    before = listening()
    with slurm_cluster(config) as cluster:  # no jobs: only the scheduler, in this process
        opened = listening() - before
        scheduler_port = port_of(cluster.scheduler_address)
        link = cluster.dashboard_link
    if address:
        assert len(opened) == 2 and scheduler_port in {p for _, p in opened}
        assert {ip for ip, _ in opened} == {"127.0.0.1"} and link
    else:
        assert {port for _, port in opened} == {scheduler_port}, opened
        assert not link


def test_a_client_of_a_scheduler_without_dashboard_has_an_empty_link():
    # `run --cluster NAME` connects by address to a scheduler that may have no dashboard.
    with cluster_client(LocalClusterConfig(workers=1, dashboard_address="")) as first:
        address = first.scheduler.address
        with cluster_client(AddressClusterConfig(address=address)) as client:
            assert client.dashboard_link == ""
            assert client.submit(sum, [2, 3]).result() == 5
