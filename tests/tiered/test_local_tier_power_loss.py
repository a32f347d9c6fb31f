"""The local-directory tier keeps what it wrote through a power loss: an object renamed
or linked into place, and a directory made for it, are fsynced in their parent directory
before the write returns (a rename alone lives in the page cache until the kernel writes
the directory back; a power loss before that loses the name, and with it the object that
durable-ack already answered OK for).

The system calls are read with strace: a power loss cannot be simulated in a test, but
the order of what reaches the disk can be checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is missing (apt-get install strace)")

_WRITER = """
import sys
from tiered.providers.local import LocalProvider
p = LocalProvider(sys.argv[1])
p.write("b1/data/t/0/00000000000000000000.log", b"log")  # new directories, a rename
p.create("b1/lease/claim.json", b"claim")  # a link
version = p.swap("b1/meta/t/0.json", b"meta", "")  # a compare-and-swap
assert version, "the swap of an absent object failed"
p.write("b1/data/t/0/00000000000000000000.log", b"log again")  # a rename over it
"""


def _trace(tmp_path: Path) -> list[str]:
    root = tmp_path / "tier"
    out = tmp_path / "strace.txt"
    subprocess.run(["strace", "-f", "-y", "-o", str(out), "-e",
                    "trace=fsync,rename,renameat,renameat2,link,linkat,mkdir,mkdirat",
                    sys.executable, "-c", _WRITER, str(root)],
                   check=True, cwd=Path(__file__).parents[2], capture_output=True)
    return out.read_text().splitlines()


def _path_args(line: str) -> list[str]:
    return re.findall(r'"([^"]+)"', line)


def test_every_name_the_tier_makes_is_fsynced_in_its_directory(tmp_path: Path) -> None:
    # Given a writer that makes objects in new directories by rename, link and swap
    lines = _trace(tmp_path)
    root = os.path.realpath(tmp_path / "tier")
    # When each name is made (an object renamed or linked into place, a directory made)
    made: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        call = re.search(r"\b(rename|renameat2?|link|linkat|mkdir|mkdirat)\(", line)
        if call and "= 0" in line:
            target = os.path.realpath(_path_args(line)[-1])
            if target.startswith(root):
                made.append((i, target))
    assert len(made) >= 10, lines  # 4 objects, their directories
    # Then a fsync of the directory that holds it follows, before the next name is made
    # by the same writer (the write has returned by then)
    for n, (i, target) in enumerate(made):
        parent = os.path.dirname(target)
        until = made[n + 1][0] if n + 1 < len(made) else len(lines)
        synced = any(re.search(r"fsync\(\d+<" + re.escape(parent) + r">\) = 0", line)
                     for line in lines[i + 1 : until])
        assert synced, f"{target} was made but {parent} was not fsynced after it"
