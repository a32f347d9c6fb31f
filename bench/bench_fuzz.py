"""Long mode of the hostile-request property test (``tests/chronomq/test_hostile_rpc.py``):
the same generated requests and oracles over every RPC of both APIs, with many more
examples per method.  Prints the calls made, the statuses they got and the defects found
(an INTERNAL or UNKNOWN answer, a leaked canary, a file touched outside the data dir):
the run fails on the first defect.

    .venv/bin/python bench/bench_fuzz.py --per-method 4000   # ~128,000 calls
    .venv/bin/python bench/bench_fuzz.py --per-method 100    # a quick look
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-method", type=int, default=4000,
                    help="generated calls per RPC (32 RPCs in the two APIs)")
    a = ap.parse_args()
    os.environ["CHRONOMQ_FUZZ_EXAMPLES"] = str(a.per_method)
    from tests.chronomq import test_hostile_rpc  # reads the setting on import

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="chronomq-fuzz-") as tmp:
        test_hostile_rpc.test_hostile_requests_on_every_rpc_of_both_apis(Path(tmp))
    print(f"elapsed: {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
