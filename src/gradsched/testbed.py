"""An emulated multi-host cluster on one machine: network namespaces, shaped links.

Why: gradient scheduling only matters when the network is the bottleneck, and a
single machine's loopback is both too fast and shared.  As root, one network
namespace per "host", each with its own ``eth0`` and address in 198.18.0.0/24 (the
range reserved for benchmarking), joined by a bridge, gives gloo real TCP over real
links; ``tc ... tbf`` on both ends of each host's link caps its bandwidth in both
directions (netem is not available on the project's machines; tbf is).

Layout, for ``prefix="gs"`` and N hosts::

    namespace gs-h0   eth0 198.18.0.1/24  --veth--  gs-p0 ┐
    namespace gs-h1   eth0 198.18.0.2/24  --veth--  gs-p1 ├ bridge gs-br0 in namespace gs-sw
    ...                                                   ┘

The bridge lives in its own namespace, so the root namespace's links and routes are
never touched, and a host's only route is its /24: it can reach the other hosts and
nothing else.  Every object's name starts with the prefix, so the testbed's state is
read from the system itself, and :func:`teardown` removes exactly what was made, even
after the process that made it was killed.  What was made is told by an identity,
not by the name: each namespace is made with a random token, written first to the mark
``/run/gradsched-testbed/<namespace>`` (a tmpfs, cleared at boot with the namespaces
themselves) and then into the namespace itself, as the alias of its ``lo``; the hosts
files under ``/etc/netns`` carry a ``# gradsched testbed`` line.  A namespace whose
``lo`` does not carry its mark's token belongs to someone else, even under a name the
testbed used (deleted by hand and made again): ``up`` refuses to adopt it, ``status``
does not count it, and ``down`` neither deletes it nor kills what runs in it (checked
again right before either, :func:`is_ours`).  ``with Testbed(...)`` (bench, train and
netbench with ``--rate``) brings up its own and refuses a prefix that exists already.  No link in the root
namespace is ever made (veth ends are created straight into their namespaces), so
none is ever deleted.

Ranks: :meth:`Testbed.launch` runs one ``torch.distributed.run`` per host with
``ranks_per_host`` processes; ranks of one host reach each other at its own address,
over the namespace's loopback (unshaped), ranks of different hosts over the links.

Shaping: a tbf on the host's ``eth0`` caps what the host sends, and a tbf on the
bridge-side ``gs-pI`` caps what it receives.  See :func:`tbf_params` for the burst and
queue sizes.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from gradsched.constants import AGENT_MODULE
from gradsched.errors import GradschedError, WorkersFailed

DEFAULT_PREFIX = "gs"
SUBNET = "198.18.0.0/24"
HOST_IFNAME = "eth0"
ETC_NETNS = "/etc/netns"  # per-namespace /etc files that `ip netns exec` mounts
MARKS_DIR = "/run/gradsched-testbed"  # one file per namespace the testbed made, holding its token (ownership)
IDENTITY_PREFIX = "gradsched-testbed:"  # + the token: the alias of lo inside each namespace the testbed made
PENDING = "pending"  # a mark written before its namespace was made, not yet confirmed
HOSTS_MARK = "# gradsched testbed"  # the line that marks a hosts file as the testbed's
MAX_HOSTS = 250  # 198.18.0.1 .. 198.18.0.250, and veth names stay under 15 characters
MAX_RANKS_PER_HOST = 64  # processes one host runs (torchrun --nproc-per-node); a sanity cap

_RATE_UNITS_BPS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")


# --------------------------------------------------------------------------- rates


def parse_rate_bps(rate: str | int) -> int:
    """Bits per second from ``"1gbit"``, ``"200mbit"``, ``"500kbit"`` or an integer.

    Only bit units are accepted: tc reads ``mbps`` as megaBYTES per second, a factor
    of 8 that is too easy to get wrong silently.
    """
    if isinstance(rate, int) and not isinstance(rate, bool):
        value = float(rate)
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*", str(rate).lower())
        if not match or match.group(2) not in ("", *_RATE_UNITS_BPS):
            raise GradschedError(
                f"rate {rate!r} is not understood; write a number of bits per second "
                "with a unit, e.g. 100mbit, 500mbit or 1gbit"
            )
        value = float(match.group(1)) * _RATE_UNITS_BPS.get(match.group(2) or "bit", 1)
    if not 10**5 <= value <= 10**11:
        raise GradschedError(f"rate {rate!r} is out of range; use 100kbit to 100gbit")
    return int(value)


def format_rate(rate_bps: float) -> str:
    """A human-readable rate, e.g. ``200mbit`` or ``1.5gbit``."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if rate_bps >= scale:
            return f"{rate_bps / scale:g}{unit}"
    return f"{rate_bps:g}bit"


def tbf_params(rate_bps: int) -> tuple[int, int]:
    """``(burst_bytes, latency_us)`` for a tbf that delivers ``rate_bps`` to TCP.

    Burst: what the link lets through at the veth's speed after an idle pause.  A real
    NIC has none, so it is as small as still delivers the rate: 1 ms worth, and at least
    two GSO super-packets (veth hands tbf up to 64 KiB at once; with a bucket of one,
    tbf waits for it to refill whole and 1 Gbit/s links delivered 85% of their cap).
    At 1 Gbit/s that is 135 kB: on 2 hosts 2-8 MiB all-reduces cost the same after a
    pause as in a stream of them, within 4% (``python benchmarks/allreduce_stream.py``;
    a larger burst and its history: docs/testbed.md, docs/cost-model.md).

    Latency (the queue, in time at the rate): 20 ms of backlog, well over the
    sub-millisecond round trip on a bridge, so TCP keeps the link full without the
    tail drops that make a shaped link look slower than its cap.
    """
    burst_bytes = max(rate_bps // 8 // 1000, 2 * (64 * 1024 + 1514))
    return burst_bytes, 20_000


# --------------------------------------------------------------------------- system


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run an iproute2 command; on failure raise with its own message."""
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GradschedError(
            f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def _json(argv: Sequence[str]) -> list[dict[str, Any]]:
    proc = _run(argv, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return []
    return json.loads(proc.stdout)


def check_can_run() -> None:
    """Raise a one-line :class:`GradschedError` unless we are root with iproute2."""
    if os.geteuid() != 0:
        raise GradschedError(
            "the testbed needs root (it creates network namespaces and tc qdiscs); "
            "run it as root, e.g. `sudo gradsched testbed up`"
        )
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise GradschedError(
            f"the testbed needs {' and '.join(missing)} from iproute2; "
            "install it (apt-get install iproute2)"
        )


def list_namespaces() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _check_prefix(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise GradschedError(
            f"testbed prefix {prefix!r} must be 1-6 lowercase letters or digits, "
            "starting with a letter (e.g. gs)"
        )
    return prefix


def _host_namespaces(prefix: str) -> dict[int, str]:
    pattern = re.compile(rf"^{re.escape(prefix)}-h([0-9]+)$")
    found = {}
    for name in list_namespaces():
        match = pattern.match(name)
        if match:
            found[int(match.group(1))] = name
    return dict(sorted(found.items()))


def _kill_namespace_processes(namespace: str, grace_s: float = 1.0) -> list[int]:
    """Stop the processes still living in ``namespace`` (workers we launched there).

    A namespace with processes in it outlives ``ip netns delete``, and so do its links.
    """
    def pids() -> list[int]:
        out = _run(["ip", "netns", "pids", namespace], check=False).stdout
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    found = pids()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids():
            break
    return found


def _mark_path(namespace: str) -> str:
    return os.path.join(MARKS_DIR, namespace)


def _read_mark(namespace: str) -> tuple[str, bool] | None:
    """``(token, confirmed)`` from ``namespace``'s mark, or None without one."""
    try:
        with open(_mark_path(namespace)) as f:
            words = f.read().split()
    except OSError:
        return None
    if len(words) == 2 and words[0] == PENDING:
        return words[1], False
    return (words[0], True) if len(words) == 1 else ("", False)


def _write_mark(namespace: str, token: str, *, confirmed: bool) -> None:
    os.makedirs(MARKS_DIR, mode=0o700, exist_ok=True)
    with open(_mark_path(namespace), "w") as f:
        f.write(token if confirmed else f"{PENDING} {token}")


def _identity(namespace: str) -> str | None:
    """The identity stored inside ``namespace``: the alias of its ``lo`` (None: no alias, or no namespace)."""
    links = _json(["ip", "-n", namespace, "-j", "link", "show", "lo"])
    return links[0].get("ifalias") if links else None


def _add_namespace(namespace: str) -> None:
    """Make ``namespace`` with a fresh identity: a random token in its mark (written first) and in the
    alias of its ``lo``, inside the namespace itself, where a namespace re-made with the same name
    cannot have it."""
    token = secrets.token_hex(12)
    _write_mark(namespace, token, confirmed=False)
    _run(["ip", "netns", "add", namespace])
    _run(["ip", "-n", namespace, "link", "set", "lo", "alias", IDENTITY_PREFIX + token])
    _write_mark(namespace, token, confirmed=True)


def _blank(namespace: str) -> bool:
    """Only ``lo``, no alias, no process: a namespace made and left before its identity was stored."""
    links = _json(["ip", "-n", namespace, "-j", "link", "show"])
    pids = _run(["ip", "netns", "pids", namespace], check=False).stdout.split()
    return [link.get("ifname") for link in links] == ["lo"] and not links[0].get("ifalias") and not pids


def _replaced(namespace: str) -> bool:
    """The namespace the testbed made under this name is gone and another has its name: its mark was
    confirmed, and the namespace now there lacks the identity."""
    mark = _read_mark(namespace)
    return mark is not None and mark[1] and not is_ours(namespace)


def is_ours(namespace: str) -> bool:
    """Did the testbed make ``namespace``, this very namespace and not one re-made under its name?

    Its mark holds a token, and the namespace holds the same token (the alias of its ``lo``).  A
    namespace deleted by hand and made again by someone else has no alias, or another: not ours
    (issue 39: ``testbed down`` killed the process in such a one).  One exception: an ``up`` killed
    between ``ip netns add`` and storing the alias leaves its mark pending and the namespace blank
    (nothing but ``lo``, no process), which is ours to remove."""
    mark = _read_mark(namespace)
    if mark is None:
        return False
    token, confirmed = mark
    alias = _identity(namespace)
    if token and alias == IDENTITY_PREFIX + token:
        return True
    return not confirmed and alias is None and _blank(namespace)


def _unmark(namespace: str) -> None:
    try:
        os.remove(_mark_path(namespace))
    except FileNotFoundError:
        pass


def _delete_namespace(namespace: str) -> None:
    """Stop the namespace's processes, delete it, its hosts file and its mark: only if it is ours,
    checked again here, right before anything is killed."""
    if not is_ours(namespace):
        raise GradschedError(f"network namespace {namespace} is no longer the one the testbed made; left it alone")
    _kill_namespace_processes(namespace)
    _remove_hosts_file(namespace)
    _run(["ip", "netns", "delete", namespace], check=False)
    _unmark(namespace)


def _remove_hosts_file(namespace: str) -> None:
    """Remove ``/etc/netns/<namespace>/hosts`` if the testbed wrote it, and the folders left empty."""
    directory = os.path.join(ETC_NETNS, namespace)
    hosts_file = os.path.join(directory, "hosts")
    try:
        with open(hosts_file) as f:
            ours = HOSTS_MARK in f.read()
    except OSError:
        ours = False
    if ours:
        os.remove(hosts_file)
    for folder in (directory, ETC_NETNS):
        try:
            os.rmdir(folder)
        except OSError:
            pass  # holds files that are not ours (or does not exist): leave it


def foreign_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Namespaces named like the testbed ``prefix``'s that the testbed did not make (it never touches them)."""
    names = re.compile(rf"^{re.escape(_check_prefix(prefix))}-(h[0-9]+|sw)$")
    return [n for n in list_namespaces() if names.match(n) and not is_ours(n)]


def _stray_ip(prefix: str) -> list[int]:
    """``ip`` commands still running on the testbed ``prefix``'s namespaces (left by an ``up`` killed alone:
    its ``ip netns add`` can make a namespace after the ``up`` is gone)."""
    found = []
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"ip" and any(a.startswith(f"{prefix}-".encode()) for a in argv):
            found.append(int(pid))
    return found


def _wait_for_stray_ip(prefix: str, timeout_s: float = 10.0) -> None:
    """Let stray ``ip`` commands on ``prefix``'s namespaces finish first, so that what they make is removed too."""
    deadline = time.monotonic() + timeout_s
    while _stray_ip(prefix) and time.monotonic() < deadline:
        time.sleep(0.05)


def teardown(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove every namespace of the testbed named ``prefix`` that the testbed made; idempotent.

    Deleting a namespace destroys the veth ends inside it, their peers, and their
    qdiscs.  Namespaces that match the names but carry no ownership mark (someone
    else's, see :func:`foreign_namespaces`) are left, and so is everything in the
    root namespace.  Returns what was removed.
    """
    check_can_run()
    _check_prefix(prefix)
    _wait_for_stray_ip(prefix)
    removed = []
    names = re.compile(rf"^{re.escape(prefix)}-(h[0-9]+|sw)$")
    for name in list_namespaces():
        if names.match(name) and is_ours(name):
            _delete_namespace(name)
            removed.append(f"netns {name}")
    if os.path.isdir(MARKS_DIR):  # marks of namespaces deleted by hand (and perhaps re-made by someone else)
        existing = list_namespaces()
        for name in os.listdir(MARKS_DIR):
            mark = _read_mark(name)
            pending = mark is not None and not mark[1]  # its ``ip netns add`` may still make it: kept, it is ours
            if names.match(name) and ((name not in existing and not pending) or _replaced(name)):
                _remove_hosts_file(name)
                _unmark(name)
    return removed


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class HostStatus:
    """One host as found on the system."""

    index: int
    namespace: str
    address: str | None
    link_up: bool
    egress_rate_bps: int | None  # tbf on the host's eth0 (what it sends)
    ingress_rate_bps: int | None  # tbf on the bridge port (what it receives)


@dataclass(frozen=True)
class TestbedStatus:
    """The testbed named ``prefix`` as found on the system (not as remembered)."""

    __test__ = False  # not a pytest class

    prefix: str
    switch: bool  # the switch namespace and its bridge exist
    hosts: list[HostStatus] = field(default_factory=list)

    @property
    def up(self) -> bool:
        """Whether a complete, shaped testbed exists."""
        return (
            self.switch
            and bool(self.hosts)
            and all(
                h.link_up and h.address and h.egress_rate_bps and h.ingress_rate_bps
                for h in self.hosts
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return {"up": self.up, **asdict(self)}

    def describe(self) -> str:
        """A few lines for people."""
        if not self.switch and not self.hosts:
            return f"testbed {self.prefix}: down (nothing found)"
        state = "up" if self.up else f"incomplete (run `gradsched testbed down --prefix {self.prefix}`, then up)"
        lines = [f"testbed {self.prefix}: {state}, {len(self.hosts)} host(s)"]
        for h in self.hosts:
            rates = "/".join(
                format_rate(r) if r else "unshaped" for r in (h.egress_rate_bps, h.ingress_rate_bps)
            )
            link = "up" if h.link_up else "DOWN"
            lines.append(f"  {h.namespace}  {h.address or 'no address'}  link {link}  "
                         f"out/in {rates}")
        return "\n".join(lines)


def _tbf_rate_bps(namespace: str, dev: str) -> int | None:
    for qdisc in _json(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", dev]):
        if qdisc.get("kind") == "tbf" and qdisc.get("root"):
            return int(qdisc["options"]["rate"]) * 8
    return None


def read_status(prefix: str = DEFAULT_PREFIX) -> TestbedStatus:
    """What of the testbed ``prefix`` exists now, read from ``ip`` and ``tc``."""
    check_can_run()
    _check_prefix(prefix)
    switch_ns = f"{prefix}-sw"
    switch = switch_ns in list_namespaces() and is_ours(switch_ns) and bool(
        _json(["ip", "-n", switch_ns, "-j", "link", "show", f"{prefix}-br0"])
    )
    hosts = []
    for index, namespace in _host_namespaces(prefix).items():
        if not is_ours(namespace):
            continue  # a namespace with the testbed's name that it did not make is not part of it
        links = _json(["ip", "-n", namespace, "-j", "addr", "show", HOST_IFNAME])
        link = links[0] if links else {}
        addresses = [a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet"]
        hosts.append(
            HostStatus(
                index=index,
                namespace=namespace,
                address=addresses[0] if addresses else None,
                link_up="UP" in link.get("flags", []) and "LOWER_UP" in link.get("flags", []),
                egress_rate_bps=_tbf_rate_bps(namespace, HOST_IFNAME) if link else None,
                ingress_rate_bps=(
                    _tbf_rate_bps(switch_ns, f"{prefix}-p{index}") if switch else None
                ),
            )
        )
    return TestbedStatus(prefix=prefix, switch=switch, hosts=hosts)


# --------------------------------------------------------------------------- testbed


class _Terminated(BaseException):
    """SIGTERM turned into an exception so that ``with Testbed(...)`` can clean up."""


class Testbed:
    """N emulated hosts with links capped at ``rate``.

    ``with Testbed(hosts=2, rate="1gbit") as tb:`` brings it up and always removes it,
    on an exception, Ctrl-C or SIGTERM too (the signal is re-delivered afterwards).
    ``up()``/``down()`` do the same by hand; ``up()`` is idempotent and reconciles
    whatever exists (a changed rate or host count, a half-made testbed) to the request.
    """

    __test__ = False  # not a pytest class

    def __init__(self, hosts: int = 2, rate: str | int = "1gbit", *,
                 prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
            raise GradschedError(f"hosts must be between 1 and {MAX_HOSTS}, got {hosts!r}")
        self.hosts = hosts
        self.rate_bps = parse_rate_bps(rate)
        self.prefix = _check_prefix(prefix)
        self._old_handlers: dict[int, Any] = {}

    # names ---------------------------------------------------------------
    @property
    def switch_namespace(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br0"

    def namespace(self, index: int) -> str:
        """The network namespace of host ``index``."""
        self._check_index(index)
        return f"{self.prefix}-h{index}"

    def port(self, index: int) -> str:
        """The bridge-side end of host ``index``'s link (in the switch namespace)."""
        self._check_index(index)
        return f"{self.prefix}-p{index}"

    @property
    def addresses(self) -> list[str]:
        """IPv4 address of each host, host 0 first."""
        return [f"198.18.0.{i + 1}" for i in range(self.hosts)]

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.hosts:
            raise GradschedError(f"host {index} does not exist; this testbed has "
                                 f"hosts 0..{self.hosts - 1}")

    # lifecycle -----------------------------------------------------------
    def up(self) -> "Testbed":
        """Create (or repair, or reshape) the testbed; safe to call again.

        If setting up fails or is interrupted, everything is removed again, so a
        failed ``up`` leaves nothing half-made behind.
        """
        check_can_run()
        try:
            self._reconcile()
        except BaseException:
            teardown(self.prefix)
            raise
        return self

    def _reconcile(self) -> None:
        existing = self._without_half_made(list_namespaces())
        sw = self.switch_namespace
        self._refuse_foreign(existing)
        if sw not in existing:
            _add_namespace(sw)
        if not _json(["ip", "-n", sw, "-j", "link", "show", self.bridge]):
            _run(["ip", "-n", sw, "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", self.bridge, "up"])
        burst_bytes, latency_us = tbf_params(self.rate_bps)
        tbf = ["tbf", "rate", f"{self.rate_bps}bit", "burst", str(burst_bytes),
               "latency", f"{latency_us}us"]
        for i in range(self.hosts):
            ns, port = self.namespace(i), self.port(i)
            if ns not in existing:
                _add_namespace(ns)
                # IPv4 only: gloo binds the first address of GLOO_SOCKET_IFNAME, which
                # must not be an IPv6 link-local one.
                _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                      "net.ipv6.conf.all.disable_ipv6=1",
                      "net.ipv6.conf.default.disable_ipv6=1"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if not _json(["ip", "-n", ns, "-j", "link", "show", HOST_IFNAME]):
                if _json(["ip", "-n", sw, "-j", "link", "show", port]):
                    _run(["ip", "-n", sw, "link", "delete", port])
                _run(["ip", "link", "add", HOST_IFNAME, "netns", ns, "type", "veth",
                      "peer", "name", port, "netns", sw])
            _run(["ip", "-n", sw, "link", "set", port, "master", self.bridge, "up"])
            _run(["ip", "-n", ns, "addr", "flush", "dev", HOST_IFNAME])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24",
                  "dev", HOST_IFNAME])
            _run(["ip", "-n", ns, "link", "set", HOST_IFNAME, "up"])
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", HOST_IFNAME, "root", *tbf])
            _run(["tc", "-n", sw, "qdisc", "replace", "dev", port, "root", *tbf])
            self._write_hosts_file(i)
        # Hosts beyond the requested count are left over from a larger testbed.
        for index, ns in _host_namespaces(self.prefix).items():
            if index >= self.hosts and is_ours(ns):
                _delete_namespace(ns)
                # its veth's switch end goes with it, but the kernel removes it asynchronously: it may
                # vanish between the check and the delete (CI: "Cannot find device"), so only what is
                # still there afterwards is an error
                port = f"{self.prefix}-p{index}"
                if _json(["ip", "-n", sw, "-j", "link", "show", port]):
                    _run(["ip", "-n", sw, "link", "delete", port], check=False)
                    if _json(["ip", "-n", sw, "-j", "link", "show", port]):
                        raise GradschedError(f"testbed: could not remove {port} from {sw}")

    def _without_half_made(self, existing: list[str]) -> list[str]:
        """``existing`` less this testbed's namespaces that a killed ``up`` left before storing their
        identity (removed here, to be made again whole)."""
        wanted = {self.switch_namespace} | {self.namespace(i) for i in range(self.hosts)}
        out = []
        for ns in existing:
            mark = _read_mark(ns) if ns in wanted else None
            if mark is not None and not mark[1] and is_ours(ns):
                _delete_namespace(ns)
                continue
            out.append(ns)
        return out

    def _refuse_foreign(self, existing: list[str]) -> None:
        """A namespace with one of this testbed's names that the testbed did not make is someone else's."""
        wanted = [self.switch_namespace] + [self.namespace(i) for i in range(self.hosts)]
        foreign = [ns for ns in wanted if ns in existing and not is_ours(ns)]
        if foreign:
            raise GradschedError(f"network namespace {foreign[0]} exists but was not made by the gradsched testbed; "
                                 f"choose another prefix (--prefix) or remove it yourself (ip netns delete {foreign[0]})")

    def _refuse_existing(self) -> None:
        """``with Testbed(...)`` brings up its own testbed and removes it afterwards: a testbed of the
        same prefix that exists already (``gradsched testbed up``, another job's, or one left by a
        killed job) is not its to reshape and remove (issue 39: ``bench --prefix P`` did both)."""
        check_can_run()
        names = re.compile(rf"^{re.escape(self.prefix)}-(h[0-9]+|sw)$")
        found = sorted(n for n in list_namespaces() if names.match(n))
        if found:
            raise GradschedError(f"testbed {self.prefix} exists already ({', '.join(found)}): this job brings up its "
                                 f"own testbed and removes it afterwards; give another --prefix, or remove that one "
                                 f"first with `gradsched testbed down --prefix {self.prefix}`")

    def _write_hosts_file(self, index: int) -> None:
        """Name the hosts for processes in host ``index``.

        ``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts`` over ``/etc/hosts``;
        without names for 198.18.0.x, torch's store warns on every connection that it
        cannot resolve the peer's hostname.
        """
        directory = os.path.join(ETC_NETNS, self.namespace(index))
        os.makedirs(directory, exist_ok=True)
        try:
            with open("/etc/hosts") as f:
                base = f.read()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # Both forms: the store listens on a dual-stack socket and sees IPv4 peers as
        # IPv4-mapped IPv6 addresses.
        ours = "::ffff:127.0.0.1 localhost\n" + "".join(
            f"{addr} {self.prefix}-h{i}\n::ffff:{addr} {self.prefix}-h{i}\n"
            for i, addr in enumerate(self.addresses))
        # First, this machine's hostname as this host's own address (first match wins): gloo's default
        # device, torchrun's c10d rendezvous (is it the host?) and the address it hands the other hosts
        # (getfqdn: the canonical name, prefix-hI) then work as on separate machines, without
        # GLOO_SOCKET_IFNAME, --local-addr or is_host (docs/torchrun.md).
        addr, name, me = self.addresses[index], self.namespace(index), socket.gethostname()
        own = f"# {self.prefix}: this host's own name and address\n{addr} {name} {me}\n::ffff:{addr} {name} {me}\n"
        with open(os.path.join(directory, "hosts"), "w") as f:
            f.write(own + _without_name(base, me).rstrip("\n") + f"\n{HOSTS_MARK} {self.prefix}\n" + ours)

    def down(self) -> list[str]:
        """Remove everything this testbed's prefix names; returns what was removed."""
        return teardown(self.prefix)

    def status(self) -> TestbedStatus:
        return read_status(self.prefix)

    def __enter__(self) -> "Testbed":
        self._refuse_existing()
        self._install_signal_handlers()
        try:
            return self.up()
        except BaseException:
            self._restore_signal_handlers()
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.down()
        finally:
            self._restore_signal_handlers()
        if exc_type is _Terminated:
            # Re-deliver SIGTERM now that the handler it had before is back in place.
            os.kill(os.getpid(), signal.SIGTERM)

    def _install_signal_handlers(self) -> None:
        """SIGTERM raises (so ``__exit__`` runs); SIGINT already raises KeyboardInterrupt."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread

        def on_term(signum: int, frame: Any) -> None:
            raise _Terminated()

        self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_term)
        # An ignored SIGINT (a background job of a script) stays ignored.
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, None):
            self._old_handlers[signal.SIGINT] = signal.signal(
                signal.SIGINT, signal.default_int_handler)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._old_handlers.clear()

    # running things on hosts --------------------------------------------
    def run_in_host(self, index: int, argv: Sequence[str], *,
                    env: Mapping[str, str] | None = None, **popen_kwargs: Any
                    ) -> subprocess.Popen:
        """Start ``argv`` inside host ``index`` (``ip netns exec``); env adds to ours.

        The process gets its own session (process group) so that it and everything
        it starts can be stopped together.
        """
        full_env = {**os.environ, **(env or {})}
        popen_kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(index), *argv],
                                env=full_env, **popen_kwargs)

    def torchrun_argv(self, index: int, script_argv: Sequence[str], *, master_port: int = 29500,
                      ranks_per_host: int = 1) -> list[str]:
        """The ``torch.distributed.run`` command that :meth:`launch` starts in host ``index``.

        ``ranks_per_host`` ranks in each host: torchrun numbers them so that host ``i`` holds
        global ranks ``[i * M, (i + 1) * M)`` and sets each rank's ``LOCAL_WORLD_SIZE=M``,
        ``LOCAL_RANK`` and ``GROUP_RANK=i`` (the node layout of TOPOLOGY.md, docs/testbed.md).
        """
        self._check_index(index)
        check_ranks_per_host(ranks_per_host)
        return [sys.executable, "-m", AGENT_MODULE,  # torch.distributed.run, quiet on a signal
                "--nnodes", str(self.hosts), "--node-rank", str(index),
                "--nproc-per-node", str(ranks_per_host), "--master-addr", self.addresses[0],
                "--master-port", str(master_port), *script_argv]

    def launch(self, script_argv: Sequence[str], *, master_port: int = 29500,
               env: Mapping[str, str] | None = None, ranks_per_host: int = 1,
               **popen_kwargs: Any) -> "Job":
        """Start one ``torch.distributed.run`` per host running ``script_argv``.

        ``ranks_per_host`` processes per host (see :meth:`torchrun_argv` for their
        numbering), rendezvous at host 0, one compute thread per rank
        (``OMP_NUM_THREADS=1``: the machine has 2 cores), gloo bound to the host's shaped
        ``eth0``.  Ranks of one host reach each other at that host's own address, which
        the kernel delivers over the namespace's loopback: their traffic never crosses a
        shaped link; ranks of different hosts talk over the links.  ``script_argv`` is
        what follows torchrun's options: a script path and its arguments, or
        ``-m module ...``.
        """
        base_env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": HOST_IFNAME, "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        procs = []
        try:
            for i in range(self.hosts):
                argv = self.torchrun_argv(i, script_argv, master_port=master_port,
                                          ranks_per_host=ranks_per_host)
                procs.append(self.run_in_host(i, argv, env=base_env, **popen_kwargs))
        except BaseException:
            Job(procs).kill()
            raise
        return Job(procs)


def _without_name(hosts_text: str, name: str) -> str:
    """A hosts file's text with ``name`` taken off every line (a line left with no name goes): the
    resolver returns every address a name has, loopback first, so the machine's own entry for its
    hostname (often 127.0.x.1) would win over a testbed host's address."""
    out = []
    for line in hosts_text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2 or name not in fields[1:]:
            out.append(line)
            continue
        names = [n for n in fields[1:] if n != name]
        if names:
            out.append(" ".join([fields[0], *names]))
    return "\n".join(out) + "\n"


def check_ranks_per_host(ranks_per_host: int) -> int:
    """``ranks_per_host`` if it is a whole number from 1 to :data:`MAX_RANKS_PER_HOST`, else a one-line error."""
    if (not isinstance(ranks_per_host, int) or isinstance(ranks_per_host, bool)
            or not 1 <= ranks_per_host <= MAX_RANKS_PER_HOST):
        raise GradschedError(f"ranks per host must be between 1 and {MAX_RANKS_PER_HOST}, got {ranks_per_host!r}")
    return ranks_per_host


def host_ranks(index: int, ranks_per_host: int) -> range:
    """The global ranks host ``index`` holds: ``[index * M, (index + 1) * M)``, as torchrun numbers them."""
    return range(index * ranks_per_host, (index + 1) * ranks_per_host)


class JobTimedOut(WorkersFailed):
    """A :class:`Job` ran past its timeout and was stopped (exit status 124, as ``timeout`` says it)."""


class Job:
    """Launchers started together (on testbed hosts, or as loopback nodes: gradsched.jobs.launch);
    they succeed or are stopped together."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs

    def wait(self, timeout_s: float | None = None) -> list[int]:
        """Wait for all; on a failure, timeout or interrupt, stop all and raise."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                codes = [p.poll() for p in self.procs]
                if any(c not in (None, 0) for c in codes):
                    failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
                    raise WorkersFailed(
                        f"job failed on host(s) {failed} "
                        f"(exit codes {[codes[i] for i in failed]}); stopped the others",
                        codes[failed[0]],
                    )
                if all(c == 0 for c in codes):
                    return [0] * len(codes)
                if deadline is not None and time.monotonic() > deadline:
                    raise JobTimedOut(f"job did not finish within {timeout_s:g} s; stopped it", 124)
                time.sleep(0.05)
        except BaseException:
            self.kill()
            raise

    def kill(self, grace_s: float = 2.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
            deadline = time.monotonic() + grace_s
            while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
                time.sleep(0.05)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


# --------------------------------------------------------------------------- bandwidth


def measure_tcp_bps(testbed: Testbed, src: int = 1, dst: int = 0, *,
                    duration_s: float = 2.0, port: int = 5201) -> float:
    """Goodput in bits/s of one TCP stream from host ``src`` to host ``dst``.

    No iperf needed.  Goodput is payload only: on a 1500-byte MTU it is about 96% of
    the tbf rate, which counts Ethernet, IP and TCP headers too.
    """
    return measure_streams_bps(testbed, [(src, dst)], duration_s=duration_s, port=port)[0]


def measure_streams_bps(testbed: Testbed, pairs: Sequence[tuple[int, int]], *,
                        duration_s: float = 2.0, port: int = 5201) -> list[float]:
    """Goodput in bits/s of concurrent TCP streams, one per ``(src, dst)`` pair.

    Each receiver counts bytes from its first byte for ``duration_s``, so connection
    set-up is not counted.  Streams into one host share its (shaped) ingress.
    """
    module = [sys.executable, "-m", "gradsched.testbed"]
    sinks: list[subprocess.Popen] = []
    sources: list[subprocess.Popen] = []
    try:
        for k, (_src, dst) in enumerate(pairs):
            sinks.append(testbed.run_in_host(
                dst, [*module, "sink", str(port + k), str(duration_s)],
                stdout=subprocess.PIPE, text=True))
        for k, (src, dst) in enumerate(pairs):
            sources.append(testbed.run_in_host(
                src, [*module, "source", testbed.addresses[dst], str(port + k),
                      str(duration_s + 1)], stdout=subprocess.DEVNULL))
        results = []
        for (src, dst), sink in zip(pairs, sinks):
            out, _ = sink.communicate(timeout=duration_s + 20)
            if sink.returncode != 0 or not out.strip():
                raise GradschedError(
                    f"bandwidth measurement from host {src} to host {dst} failed")
            results.append(float(out.split()[0]))
        return results
    finally:
        Job(sources + sinks).kill(grace_s=0.5)


def _sink(port: int, duration_s: float) -> None:
    """Accept one connection, read for ``duration_s`` after its first byte, print bit/s."""
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(15)
    conn, _ = server.accept()
    buf = bytearray(1 << 20)
    conn.recv_into(buf)  # the clock starts at the first byte
    start = time.perf_counter()
    total = 0
    while (now := time.perf_counter()) - start < duration_s:
        n = conn.recv_into(buf)
        if n == 0:
            break
        total += n
    print(total * 8 / (now - start))


def _source(host: str, port: int, duration_s: float) -> None:
    """Connect (retrying while the sink starts) and send zeros for ``duration_s``."""
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = bytes(1 << 18)
    end = time.monotonic() + duration_s
    try:
        while time.monotonic() < end:
            conn.sendall(chunk)
    except OSError:
        pass  # the sink closed: it has its number


if __name__ == "__main__":
    # Internal helpers for measure_tcp_bps, run inside host namespaces.
    if sys.argv[1] == "sink":
        _sink(int(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "source":
        _source(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
