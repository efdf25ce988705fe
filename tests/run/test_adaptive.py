"""An adaptive cluster that starts with no worker (adapt minimum 0) plays a run: the round
loop asks for a worker before it sends the round's data out, since Dask's scatter needs
one and adapt starts workers only for tasks."""

import logging

from distributed import Client, LocalCluster

from simpipe.run.console import Console
from simpipe.run.population import build_population
from simpipe.run.simulation import run_simulation

from support import small_config


def test_a_run_on_an_adaptive_cluster_from_zero_workers_finishes(tmp_path, dask_client):
    config = small_config(tmp_path, population={"size": 200, "partitions": 4},
                          game={"rounds": 2})
    # Built beforehand, so that the first thing the run sends to the cluster is a round.
    build_population(config, client=dask_client)
    with LocalCluster(n_workers=0, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        cluster.adapt(minimum=0, maximum=2)
        with Client(cluster) as client:
            assert not client.nthreads()  # no worker yet
            result = run_simulation(config, client=client, console=Console(quiet=True))
    assert result.state == "finished"
    rounds = result.rounds()
    assert len(rounds) == 400 and (rounds["status"] == "ok").all()
