"""A real Slurm cluster (Debian's slurm-wlm 22.05 and munge) on this machine, built for one test session.

    with SlurmCluster(tmp) as cluster:      # hosts ctl, a, b: network namespaces on one bridge (hosts.py)
        cluster.login(["sbatch", ...])        # a command on the login/controller host, SLURM_CONF set
        cluster.node_pids("a")                # processes of compute host a (its slurmd excluded)

Host ``ctl`` runs munged and slurmctld and serves as the login node; hosts ``a`` and ``b`` each run one slurmd
(``-N a`` / ``-N b``) bound to their own address, so every job step of a node runs inside that node's
namespace. Config, state, spool and logs live under the given folder: nothing in /etc/slurm is read or
written, and no daemon outside the namespaces is touched. ``close`` stops the daemons and deletes the
namespaces (hosts.py kills whatever is left in them).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "multinode"))
from hosts import NamespaceHosts, NamespacesUnavailable, _signal  # noqa: E402

PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge",
            "shellcheck": "shellcheck"}
"""Command -> the Debian package that brings it (bookworm serves Slurm 22.05.8, munge 0.5.15, shellcheck 0.9.0)."""
NODES = ("a", "b")


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started here (no apt, no root, no namespaces)."""


def ensure_packages() -> None:
    """Install what is missing with apt-get. Services are not started by the packages in containers
    (policy-rc.d); this cluster starts its own daemons."""
    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise SlurmUnavailable(f"{', '.join(missing)} missing and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    out = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:  # the package lists may be stale or absent
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=300)
        out = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SlurmUnavailable(f"apt-get install {' '.join(missing)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")


def _config(root: Path, addr: dict[str, str], cpus: int, first_job: int) -> str:
    nodes = "\n".join(f"NodeName={n} NodeAddr={addr[n]} CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 State=UNKNOWN" for n in NODES)
    return f"""\
ClusterName=mrltest
MailProg=/bin/true
FirstJobId={first_job}
SlurmctldHost=ctl({addr['ctl']})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/linear
MpiDefault=none
ReturnToService=2
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=600
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.hosts = NamespaceHosts(["ctl", *NODES])
        self.conf = self.root / "slurm.conf"
        self.cpus = cpus
        self.daemons: list[subprocess.Popen] = []
        self.env = {"SLURM_CONF": str(self.conf)}

    def __enter__(self) -> "SlurmCluster":
        ensure_packages()
        try:
            self.hosts.__enter__()
        except NamespacesUnavailable as err:
            raise SlurmUnavailable(str(err)) from err
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        for sub in ("munge", "ctld", "spool/a", "spool/b", "run", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        munge = self.root / "munge"
        os.chmod(munge, 0o711)  # munged wants its socket's folder searchable by all
        key = munge / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        # job ids unlike an earlier cluster's, whose node-local files (/tmp/ray_<job>_<node>) may still lie about
        self.conf.write_text(_config(self.root, self.hosts.addr, self.cpus, 1000 + secrets.randbelow(10 ** 6)))
        self._daemon("ctl", ["munged", "-F", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}",
                             f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed",
                             f"--log-file={self.root}/log/munged.log"], "munged")
        self._wait(lambda: (munge / "munge.socket").exists(), 20, "munged's socket")
        self._daemon("ctl", ["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self.login(["scontrol", "ping"], check=False).returncode == 0, 60, "slurmctld to answer")
        for node in NODES:
            self._daemon(node, ["slurmd", "-D", "-N", node, "-f", str(self.conf)], f"slurmd.{node}")
        self._wait(self._nodes_idle, 90, "both nodes idle in sinfo")

    def _daemon(self, host: str, argv: list[str], name: str) -> None:
        """``argv`` in host ``host`` under its own host name (a UTS namespace: slurmctld and slurmd check that the
        machine's name is the one slurm.conf gives them). ``ip netns exec`` gives each command a fresh /sys without
        the cgroup mounts, and slurmd 22.05 will not start without a cgroup filesystem there even when no cgroup
        plugin is used: an empty tmpfs in the command's own mount namespace satisfies it (cgroup/v1, unused)."""
        setup = f"hostname {host} && mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec \"$@\""
        named = ["unshare", "--uts", "sh", "-c", setup, "sh", *argv]
        with open(self.root / "log" / f"{name}.out", "w") as log:
            self.daemons.append(self.hosts.run(host, named, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def _nodes_idle(self) -> bool:
        out = self.login(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(n) == "idle" for n in NODES)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [d.args for d in self.daemons if d.poll() is not None]
            if dead:
                raise SlurmUnavailable(f"a daemon exited while waiting for {what}: {dead}\n{self.logs()}")
            time.sleep(0.5)
        raise SlurmUnavailable(f"timed out after {timeout_s} s waiting for {what}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.root / "log").glob("*")))

    def login(self, argv: list[str], check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on the login host (where slurmctld listens), with the cluster's SLURM_CONF."""
        out = subprocess.run(self.hosts.command("ctl", argv), capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **self.hosts.env, **self.env, **kwargs.pop("env", {})}, **kwargs)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def job_state(self, job_id: str) -> str:
        out = self.login(["scontrol", "show", "job", job_id], check=False).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "GONE"

    def node_pids(self, node: str) -> list[int]:
        """Processes in host ``node`` other than its slurmd (what a job left behind)."""
        daemons = {d.pid for d in self.daemons}
        return [p for p in self.hosts.pids(node) if p not in daemons and not _is_slurmd(p)]

    def close(self) -> None:
        for daemon in reversed(self.daemons):  # slurmds, slurmctld, then munged
            _signal(daemon.pid, 15)
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
        self.daemons = []
        self.hosts.close()


def _is_slurmd(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and argv[0].endswith(b"slurmd")
