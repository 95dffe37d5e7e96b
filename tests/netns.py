"""Hosts a sandbox must not reach, which the test makes itself: no isolation test sends traffic past this machine.

:func:`outside_hosts` creates a network namespace joined to the host by a veth pair with addresses of its own (a /30
drawn at random from ``10.213.0.0/16``), and a TCP listener on each end: ``outside`` (inside the namespace, standing in
for any host a route leads to) and ``host`` (the host's end, standing in for the host's own non-loopback address). The
host reaches both (:meth:`Outside.check_reachable` proves it, so a probe refused there is refused by the sandbox, not
by a listener that was never up); a sandbox that regressed to the host's network would reach them too, and its
traffic would still stay on this machine. :data:`SANDBOX_NETWORK_PROBE` is Python a sandbox runs to report its
interfaces and routes: a sandbox without a network has only ``lo`` and no route.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

LISTENER = r"""
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, peer = server.accept()
    print(peer[0], flush=True)
    conn.close()
"""

SANDBOX_NETWORK_PROBE = r"""
import json, os
routes = [line.split()[:3] for line in open("/proc/net/route").read().splitlines()[1:] if line.strip()]
routes6 = [line.split()[:2] for line in open("/proc/net/ipv6_route").read().splitlines() if line.strip() and not line.split()[-1] == "lo"] \
    if os.path.exists("/proc/net/ipv6_route") else []
interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:] if ":" in line)
print("NETWORK " + json.dumps({"interfaces": interfaces, "routes": routes, "routes6": routes6}))
"""
"""Prints ``NETWORK {"interfaces": [...], "routes": [...], "routes6": [...]}``: a sandbox without a network prints
``{"interfaces": ["lo"], "routes": [], "routes6": []}`` (IPv6 routes through ``lo`` left out)."""


@dataclass
class Listener:
    address: str
    port: int
    peers: list[str] = field(default_factory=list)


@dataclass
class Outside:
    outside: Listener  # in the test's network namespace
    host: Listener  # on the host's end of the veth pair

    @property
    def targets(self) -> list[tuple[str, int]]:
        return [(self.outside.address, self.outside.port), (self.host.address, self.host.port)]

    def check_reachable(self) -> None:
        """Connect from the host to both listeners and wait until each saw it: the positive control."""
        for listener in (self.outside, self.host):
            seen = len(listener.peers)
            socket.create_connection((listener.address, listener.port), timeout=5).close()
            for _ in range(100):
                if len(listener.peers) > seen:
                    break
                time.sleep(0.05)
            assert len(listener.peers) > seen, f"the test's own listener {listener.address}:{listener.port} saw no connection from the host"

    def connections(self) -> int:
        return len(self.outside.peers) + len(self.host.peers)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _listen(prefix: list[str], address: str) -> tuple[subprocess.Popen[str], Listener]:
    proc = subprocess.Popen([*prefix, sys.executable, "-c", LISTENER, address], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    listener = Listener(address, int(proc.stdout.readline()))

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            listener.peers.append(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return proc, listener


@contextlib.contextmanager
def outside_hosts() -> Iterator[Outside]:
    """A network namespace and veth pair of the test's own (removed on exit) with a TCP listener on each end. Needs
    root (``ip netns``), as the sandboxes themselves do."""
    tag = uuid.uuid4().hex[:8]
    netns, host_if, ns_if = f"crucible-test-{tag}", f"crh{tag}", f"crn{tag}"
    block = random.Random().randrange(0, 1 << 14) * 4  # a /30 in 10.213.0.0/16
    host_ip, ns_ip = (f"10.213.{(block + i) >> 8}.{(block + i) & 255}" for i in (1, 2))
    procs: list[subprocess.Popen[str]] = []
    with contextlib.ExitStack() as cleanup:
        _ip("netns", "add", netns)
        cleanup.callback(subprocess.run, ["ip", "netns", "delete", netns], capture_output=True)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        cleanup.callback(subprocess.run, ["ip", "link", "delete", host_if], capture_output=True)
        _ip("link", "set", ns_if, "netns", netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        inside = ["ip", "netns", "exec", netns]
        for args in (["addr", "add", f"{ns_ip}/30", "dev", ns_if], ["link", "set", ns_if, "up"], ["link", "set", "lo", "up"],
                     ["route", "add", "default", "via", host_ip]):
            subprocess.run([*inside, "ip", *args], check=True, capture_output=True)
        cleanup.callback(lambda: [(p.kill(), p.wait()) for p in procs])
        outside_proc, outside = _listen(inside, ns_ip)
        host_proc, host = _listen([], host_ip)
        procs += [outside_proc, host_proc]
        yield Outside(outside=outside, host=host)
