"""The systems the peer benchmark compares, behind one small client interface.

* ``chronomq``: ``chronomq serve`` with its default durable settings (fsync before a Send
  answers); Send in batches, consumption over the Subscribe stream with acks.
* ``beanstalkd``: ``beanstalkd -b DIR`` (binlog on, its default fsync every 50 ms); put
  with a delay, reserve with a TTR, delete as the ack.  One request per message (its
  protocol has no batch put).  Delays are whole seconds in its protocol, so a job due
  in the future is put at its due time minus a whole number of seconds (``schedule``):
  it is measured at its best, not at the harness's rounding.
* ``redis``: ``redis-server --appendonly yes --appendfsync everysec``; the sorted-set
  delay queue as commonly written: ZADD by due time (pipelined), a mover process moving
  due items to a list with a Lua script (sleeping until the next due member, 10 ms at
  most), consumers BLMOVE into a processing list and LREM as the ack.

Every client also has the one-message-per-call modes (``Client``): chronomq's through its
batching Producer and Consumer iterator, the peers' through one request per message.

Each client is created inside a worker process from ``(system, address)``.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from testkit.process import ServerProcess

TOPIC = "bench"
GROUP = "bench"
BODY_BYTES = 100


def body(seq: int, due_ms: int) -> bytes:
    """A 100-byte body carrying its sequence number and due time."""
    head = f"{seq}:{due_ms}:".encode()
    return head + b"x" * (BODY_BYTES - len(head))


def due_of(b: bytes) -> int:
    return int(b.split(b":", 2)[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ---------------------------------------------------------------------- servers

class Server:
    name = ""
    address = ""
    pid = 0

    def __init__(self, root: Path) -> None:
        self.root = root

    def stop(self) -> None: ...

    def disk_mb(self) -> float:
        return dir_mb(self.root)


class ChronomqServer(Server):
    name = "chronomq"
    settings: tuple[str, ...] = ()

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._srv = ServerProcess(root / "data", f"tier.local_dir={root / 'tier'}",
                                  *self.settings)
        self.address, self.pid = self._srv.target, self._srv.proc.pid
        from chronomq.client import ChronomqClient

        with ChronomqClient(self.address) as c:
            c.create_topic(TOPIC, queue_count=4)

    def stop(self) -> None:
        self._srv.terminate()


class DurableChronomqServer(ChronomqServer):
    """``chronomq serve`` with ``tier.durable_ack``: a Send, a Pop's leases and an Ack
    answer once in the tier (a local directory here), the mode a fleet with failover runs."""

    name = "chronomq-durable"
    settings = ("tier.upload=true", "tier.durable_ack=true")


class BeanstalkdServer(Server):
    name = "beanstalkd"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        port = free_port()
        (root / "binlog").mkdir(parents=True)
        self._proc = subprocess.Popen(["beanstalkd", "-l", "127.0.0.1", "-p", str(port),
                                       "-b", str(root / "binlog"), "-z", "65535"])
        self.address, self.pid = f"127.0.0.1:{port}", self._proc.pid
        _wait_port(port)

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(30)


class RedisServer(Server):
    name = "redis"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(root),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--daemonize", "no", "--logfile", str(root / "redis.log")])
        self.address, self.pid = f"127.0.0.1:{port}", self._proc.pid
        _wait_port(port)
        self._mover = subprocess.Popen([sys.executable, "-m", "bench.peers", self.address],
                                       cwd=Path(__file__).resolve().parents[1])

    def stop(self) -> None:
        self._mover.terminate()
        self._mover.wait(30)
        self._proc.terminate()
        self._proc.wait(30)


SERVERS: dict[str, type[Server]] = {"chronomq": ChronomqServer,
                                     "chronomq-durable": DurableChronomqServer,
                                     "beanstalkd": BeanstalkdServer, "redis": RedisServer}


def available() -> list[str]:
    return ["chronomq", "chronomq-durable"] + [n for n, b in (("beanstalkd", "beanstalkd"),
                                          ("redis", "redis-server")) if shutil.which(b)]


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


# ---------------------------------------------------------------------- redis mover

MOVE = """
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1000)
if #items > 0 then
  redis.call('RPUSH', KEYS[2], unpack(items))
  redis.call('ZREM', KEYS[1], unpack(items))
end
return #items
"""


def run_mover(address: str) -> None:
    """Move due members of the delay set to the ready list; when none is due, sleep
    until the next one is (looking again at least every 10 ms for new arrivals)."""
    import redis

    host, port = address.split(":")
    r = redis.Redis(host, int(port))
    move = r.register_script(MOVE)
    while True:
        moved = move(keys=["delayed", "ready"], args=[int(time.time() * 1000)])
        if moved < 1000:  # sleep until the next member is due (at most 10 ms: arrivals)
            head = r.zrange("delayed", 0, 0, withscores=True)
            wait = (head[0][1] - time.time() * 1000) / 1000 if head else 0.01
            if wait > 0:
                time.sleep(min(0.01, wait))


# ---------------------------------------------------------------------- clients

class Client:
    """``mode``: ``batch`` (each system's natural batching), ``single`` (one message per
    call in the application's code, through the system's client library) or
    ``single-wait`` (one message per call, each answer awaited before the next)."""

    def __init__(self, address: str, mode: str = "batch") -> None:
        self.mode = mode

    def put(self, items: list[tuple[bytes, int]]) -> None:
        """Store messages: (body, due ms; 0 = now)."""

    def schedule(self, items: list[tuple[bytes, int]], batch: int) -> None:
        """Store messages due in the future, ahead of time (all before the first is due
        unless the system needs otherwise)."""
        for at in range(0, len(items), batch):
            self.put(items[at : at + batch])

    def take(self) -> list[tuple[Any, bytes]]:
        """Some delivered messages as (handle, body); [] after about a second idle."""
        return []

    def ack(self, handles: list[Any]) -> None: ...

    def close(self) -> None: ...


class ChronomqClientAdapter(Client):
    """batch: one Send per batch, Subscribe with acks per response.  single: the
    batching Producer (``send`` per message, futures awaited every WINDOW) and the
    Consumer iterator (``next`` and ``ack`` per message).  single-wait: the Producer,
    each future awaited before the next send."""

    WINDOW = 1000

    def __init__(self, address: str, mode: str = "batch") -> None:
        from chronomq.client import ChronomqClient

        super().__init__(address, mode)
        self._c = ChronomqClient(address)
        self._sub: Any = None
        self._producer: Any = None
        self._consumer: Any = None
        self._q: queue.Queue[list[tuple[Any, bytes]]] = queue.Queue()

    def put(self, items: list[tuple[bytes, int]]) -> None:
        from chronomq.client import message
        from chronomq.client.producer import Producer

        if self.mode == "batch":
            out = self._c.send([message(TOPIC, b, deliver_at_ms=due or None)
                                for b, due in items])
            if not all(o.ok for o in out):
                raise RuntimeError("chronomq send failed")
            return
        if self._producer is None:
            self._producer = Producer(self._c)
        send = self._producer.send
        if self.mode == "single-wait":
            for b, due in items:
                send(TOPIC, b, deliver_at_ms=due or None).result()
            return
        futures = [send(TOPIC, b, deliver_at_ms=due or None) for b, due in items]
        for f in futures:
            f.result()

    def schedule(self, items: list[tuple[bytes, int]], batch: int) -> None:
        super().schedule(items, self.WINDOW if self.mode == "single" else batch)

    def take(self) -> list[tuple[Any, bytes]]:
        if self.mode != "batch":
            return self._take_one()
        if self._sub is None:  # a Subscribe stream, read by a thread into a queue
            self._sub = self._c.subscribe(TOPIC, GROUP, 300, 1024)
            threading.Thread(target=self._read, daemon=True).start()
        try:
            out = self._q.get(timeout=1.0)
        except queue.Empty:
            return []
        while not self._q.empty():
            out += self._q.get_nowait()
        return out

    def _take_one(self) -> list[tuple[Any, bytes]]:
        from chronomq.client.consumer import Consumer

        if self._consumer is None:
            self._consumer = Consumer(self._c, TOPIC, GROUP, invisible_time_s=300)
        m = self._consumer.receive(timeout_s=1.0)
        return [(m, m.body)] if m is not None else []

    def _read(self) -> None:
        try:
            for r in self._sub.responses():
                if r.messages:
                    self._q.put([(m.receipt_handle, m.body) for m in r.messages])
        except Exception:  # the stream closed
            return

    def ack(self, handles: list[Any]) -> None:
        if self._consumer is not None:
            for m in handles:
                f = self._consumer.ack(m)
                if self.mode == "single-wait":
                    f.result()
            return
        self._sub.ack(handles)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        if self._consumer is not None:
            self._consumer.close()
        if self._sub is not None:
            self._sub.close()
        self._c.close()


class BeanstalkdClient(Client):
    """One request per message in every mode (its protocol has no batch put)."""

    PUTS_PER_SLOT = 5000  # jobs one process puts in one whole-second slot
    LEAD_S = 2  # a job is put this many whole seconds before its due time
    FAR_S = 60

    def __init__(self, address: str, mode: str = "batch") -> None:
        import greenstalk

        super().__init__(address, mode)
        host, port = address.split(":")
        self._c = greenstalk.Client((host, int(port)), encoding=None)
        self.missed = 0  # scheduled puts that came after their slot

    def put(self, items: list[tuple[bytes, int]]) -> None:
        now = time.time() * 1000
        for b, due in items:
            delay = max(0, -(-(due - now) // 1000)) if due else 0  # whole seconds, rounded up
            self._c.put(b, delay=int(delay), ttr=300)

    def schedule(self, items: list[tuple[bytes, int]], batch: int) -> None:
        """Put each job LEAD_S seconds before its due time with a delay of LEAD_S: it
        becomes ready at its due time, not up to a second after (delays are whole seconds
        in beanstalkd's protocol).  Jobs due at one instant are spread over the whole-
        second slots before it, PUTS_PER_SLOT each, the first with the longest delay.  A
        job whose slot has passed is put with its delay rounded up (late, never early);
        jobs due more than FAR_S ahead too (their lateness is not measured)."""
        now0 = time.time() * 1000
        self.put([(b, due) for b, due in items if not due or due - now0 > self.FAR_S * 1000])
        same: dict[int, int] = {}
        seen: dict[int, int] = {}
        plan: list[tuple[int, int, bytes]] = []  # (put at ms, delay s, body)
        near = [(b, due) for b, due in items if due and due - now0 <= self.FAR_S * 1000]
        for _, due in near:
            same[due] = same.get(due, 0) + 1
        for b, due in near:
            k = seen.get(due, 0)
            seen[due] = k + 1
            lead = self.LEAD_S + (same[due] - 1 - k) // self.PUTS_PER_SLOT
            plan.append((due - lead * 1000, lead, b))
        plan.sort(key=lambda p: p[0])
        self.missed = 0
        for at, lead, b in plan:
            wait = (at - time.time() * 1000) / 1000
            if wait >= 0:
                time.sleep(wait)
            else:
                self.missed += wait < -0.001  # more than 1 ms after its slot
                lead = max(0, -(-(at + lead * 1000 - time.time() * 1000) // 1000))
            self._c.put(b, delay=int(lead), ttr=300)

    def take(self) -> list[tuple[Any, bytes]]:
        import greenstalk

        try:
            job = self._c.reserve(timeout=1)
        except greenstalk.TimedOutError:
            return []
        return [(job, job.body)]

    def ack(self, handles: list[Any]) -> None:
        for job in handles:
            self._c.delete(job)

    def close(self) -> None:
        self._c.close()


class RedisClient(Client):
    """batch: pipelined ZADD; single modes: one ZADD per request.  Taking is one BLMOVE
    per message in every mode; the ack one LREM (pipelined in batch mode)."""

    def __init__(self, address: str, mode: str = "batch") -> None:
        import redis

        super().__init__(address, mode)
        host, port = address.split(":")
        self._r = redis.Redis(host, int(port))
        self._processing = f"processing:{os.getpid()}"

    def put(self, items: list[tuple[bytes, int]]) -> None:
        now = int(time.time() * 1000)
        if self.mode != "batch":
            for b, due in items:
                self._r.zadd("delayed", {b: due or now})
            return
        p = self._r.pipeline(transaction=False)
        for b, due in items:
            p.zadd("delayed", {b: due or now})
        p.execute()

    def take(self) -> list[tuple[Any, bytes]]:
        b = self._r.blmove("ready", self._processing, 1, "LEFT", "RIGHT")
        return [(b, b)] if b is not None else []

    def ack(self, handles: list[Any]) -> None:
        if self.mode != "batch":
            for b in handles:
                self._r.lrem(self._processing, 1, b)
            return
        p = self._r.pipeline(transaction=False)
        for b in handles:
            p.lrem(self._processing, 1, b)
        p.execute()

    def close(self) -> None:
        self._r.close()


def client(system: str, address: str, mode: str = "batch") -> Client:
    kinds: dict[str, type[Client]] = {"chronomq": ChronomqClientAdapter,
                                      "chronomq-durable": ChronomqClientAdapter,
                                      "beanstalkd": BeanstalkdClient, "redis": RedisClient}
    return kinds[system](address, mode)


if __name__ == "__main__":
    run_mover(sys.argv[1])
