"""The test stack's Spark standalone cluster (``devtools/stack/spark_cluster.py``): a master
and a worker from pyspark's own jars, so every task runs in an executor JVM of its own and
its Python workers, as on a cluster of many machines.

The platform's end-to-end run on it is ``spark/test_object_store.py``: a chunked
generation during a workload, the continuous apply and verify, with ``spark.master:
spark://…`` and an S3 lake as the config's only changes, the production shape. It used to
run here with a local lake; one run now covers both (a Spark cluster's executors have
nothing the driver has unless the tasks bring it: jars, passwords, files, the interpreter,
the store's key pair).
"""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform_tests.integration.test_stack import LOOPBACK, listening

pytestmark = pytest.mark.integration


def test_the_cluster_listens_on_loopback_only(spark_cluster: Any) -> None:
    ports = (spark_cluster.master_port, spark_cluster.master_ui_port, spark_cluster.worker_port,
             spark_cluster.worker_ui_port)  # fmt: skip
    for port in ports:
        addresses = listening(port)
        assert addresses and set(addresses) <= LOOPBACK, (port, addresses)
