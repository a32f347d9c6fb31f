"""moto's S3 server for the benchmarks: one in this process, a bucket made, its
endpoint returned (the tests' twin is ``tests.conftest``'s ``s3_endpoint``)."""

from __future__ import annotations

import logging


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
