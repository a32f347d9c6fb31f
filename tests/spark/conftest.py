"""A real Spark session (local[2], loopback-bound) for the Spark tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark.session import make_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if shutil.which("java") is None:
        pytest.fail("Spark tests need Java 17 on PATH (java not found)")
    session = make_session("local[2]", "chronomq-tests")
    yield session
    session.stop()
