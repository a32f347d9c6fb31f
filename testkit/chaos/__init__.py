"""The failover chaos: brokers on one bucket (``cluster``), its clients and ledger
(``workload``), the fault kinds (``faults``), a run start to end (``run``) and its drain
and checks (``check``).  ``bench/bench_failover.py`` is its command line,
``tests/chronomq/test_failover_chaos.py`` its short mode in CI."""
