# SPDX-License-Identifier: Apache-2.0
"""Network namespaces joined by veth pairs with `tc tbf`, for bench/torch_e2e.py.

The topology and the tbf parameters are bench/netns_links.{h,cc}'s (psched-bench), written
again here with `ip` and `tc` because the benchmark's processes (workers, shards) are separate
programs, started with `ip netns exec` into a namespace, while NetnsLinks moves threads of one
C++ process into namespaces:

    namespace psched-e2e-<pid>-hub          namespace psched-e2e-<pid>-w<i>, one per worker
    s<i>  10.77.<i>.1/24  <---- veth ---->  eth0  10.77.<i>.2/24
    egress: tbf = worker i's downlink       egress: tbf = worker i's uplink

One addition to NetnsLinks: the hub forwards IP between the links and every worker routes
10.77.0.0/16 through it, so that DDP's workers, which talk to each other rather than to shards,
reach each other through the hub and every byte crosses the sender's uplink and the receiver's
downlink, as psched's pushes and fresh values do.

A rate of None leaves the veth pairs unshaped (no qdisc beyond the default).
"""
import json
import os
import shutil
import subprocess

PREFIX = "psched-e2e-"
NETNS_DIR = "/var/run/netns"  # where `ip netns add` mounts namespaces
MTU = 9000  # jumbo frames, as NetnsLinks::kMtu: headers cost 0.7% of the rate


def find_tool(tool):
    """The full path of iproute2's `tool`; not via $PATH, as root shells often lack /usr/sbin."""
    for directory in ("/usr/sbin", "/sbin", "/usr/bin", "/bin"):
        path = os.path.join(directory, tool)
        if os.access(path, os.X_OK):
            return path
    return None


def unavailable_reason():
    """Why namespaces cannot be made here, or None if they may work."""
    if os.geteuid() != 0:
        return "not root (namespaces and tc need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "tc"):
        if find_tool(tool) is None:
            return f"`{tool}` not found (package iproute2)"
    return None


def run(*argv):
    """Runs an iproute2 command; raises RuntimeError naming it and what it printed."""
    argv = [find_tool(argv[0]) or argv[0], *argv[1:]]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed (exit status {done.returncode}): "
                           f"{done.stdout.strip()}")
    return done.stdout


def tbf_params(bits_per_s):
    """NetnsLinks::tbf_params: burst 2 ms of the rate but at least 128 KiB (veth hands tbf
    64 KiB GSO super-packets), a 256 MiB queue so that tbf delays and never drops."""
    return {"rate": f"{int(round(bits_per_s))}bit",
            "burst": str(max(int(bits_per_s / 8 * 2e-3), 128 << 10)),
            "limit": str(256 << 20)}


def stale_namespaces():
    """Namespaces a torch_e2e process that has exited left behind."""
    stale = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            stale.append(name)
    return stale


class Links:
    """The topology for `workers` workers with links of `bits_per_s` each way (None:
    unshaped). Use as a context manager: leaving it deletes the namespaces."""

    def __init__(self, workers, bits_per_s):
        for name in stale_namespaces():
            run("ip", "netns", "delete", name)
        base = f"{PREFIX}{os.getpid()}-"
        self.hub = base + "hub"
        self.workers = [f"{base}w{i}" for i in range(workers)]
        self.bits_per_s = bits_per_s
        self._created = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def hub_address(worker):
        """The hub's end of `worker`'s link: where that worker reaches the shards."""
        return f"10.77.{worker}.1"

    @staticmethod
    def worker_address(worker):
        return f"10.77.{worker}.2"

    def exec_prefix(self, namespace):
        """The argv prefix that runs a program in `namespace` (ip netns exec execs it, so the
        child's pid is the program's)."""
        return [find_tool("ip"), "netns", "exec", namespace]

    def tbf_drops(self):
        """tbf's drops on every link so far, both ends (should stay 0)."""
        drops = 0
        for i, namespace in enumerate(self.workers):
            for ns, dev in ((self.hub, f"s{i}"), (namespace, "eth0")):
                for qdisc in json.loads(run("tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev",
                                            dev)):
                    if qdisc.get("kind") == "tbf":
                        drops += qdisc.get("drops", 0)
        return drops

    def close(self):
        for name in reversed(self._created):
            run("ip", "netns", "delete", name)
        self._created = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _add_namespace(self, name):
        run("ip", "netns", "add", name)
        self._created.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")

    def _shape(self, namespace, dev):
        if self.bits_per_s is None:
            return
        tbf = tbf_params(self.bits_per_s)
        run("tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
            tbf["rate"], "burst", tbf["burst"], "limit", tbf["limit"])

    def _build(self):
        if len(self.workers) > 250:
            raise RuntimeError("at most 250 workers (10.77.<worker>.x)")
        self._add_namespace(self.hub)
        run("ip", "netns", "exec", self.hub, shutil.which("sysctl") or "/usr/sbin/sysctl",
            "-q", "-w", "net.ipv4.ip_forward=1")
        for i, namespace in enumerate(self.workers):
            self._add_namespace(namespace)
            run("ip", "-n", self.hub, "link", "add", f"s{i}", "mtu", str(MTU), "type", "veth",
                "peer", "name", "eth0", "netns", namespace, "mtu", str(MTU))
            for ns, dev, address in ((self.hub, f"s{i}", self.hub_address(i)),
                                     (namespace, "eth0", self.worker_address(i))):
                run("ip", "-n", ns, "addr", "add", address + "/24", "dev", dev)
                run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", namespace, "route", "add", "10.77.0.0/16", "via",
                self.hub_address(i))
            self._shape(self.hub, f"s{i}")  # downlink: hub side egress
            self._shape(namespace, "eth0")  # uplink: worker side egress
