"""Sandbox limits hold for the sandbox as a whole, not per process: one memory and process budget
(a cgroup per sandbox), a work directory of fixed size off the host's disk, and a seccomp filter
against the kernel's larger surfaces (new namespaces, mount, ptrace, kexec, bpf, keyrings).

Each test records what it tried with ``category="sandbox_limits"``. The process backend runs the
budget and work-directory tests too: it has no namespaces, so the cgroup is all that separates two
of its sandboxes (RLIMIT_NPROC counts every process of the uid, other sandboxes' included).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Reliability

from posttrain.platform.sandbox import (
    CallStatus,
    ProcessBackendWarning,
    SandboxConfig,
    SandboxPool,
    limits,
    seccomp,
    workdir,
)
from posttrain.platform.sandbox.cgroups import CgroupHost, detect

pytestmark = pytest.mark.requires("bubblewrap")
CATEGORY = "sandbox_limits"
BACKENDS = ["bwrap", "process"]
MB = 1 << 20


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="posttrain-test-limits-"))  # reachable by the sandbox user
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def pool_of(data_dir: Path, backend: str = "bwrap", **settings: Any) -> Iterator[SandboxPool]:
    config = SandboxConfig(backend=backend, pool_size=2, call_timeout_s=20.0, kill_grace_s=0.5, **settings)  # type: ignore[arg-type]
    warns = pytest.warns(ProcessBackendWarning) if backend == "process" else contextlib.nullcontext()
    with warns, SandboxPool(config, data_dir=data_dir) as pool:
        yield pool


def healthy(pool: SandboxPool) -> bool:
    """Full size again and every sandbox answering."""
    if not pool.wait_ready(30):
        return False
    for _ in range(pool.config.pool_size):
        with pool.acquire(timeout=10) as sandbox:
            if sandbox.run_python("6 * 7").value != "42":
                return False
    return True


# ------------------------------------------------------------------------------------ memory
TOGETHER = """
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = bytearray(100 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(2)
        os._exit(0)
    children.append(pid)
[os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
"""


@pytest.mark.requires("cgroups")
@pytest.mark.parametrize("backend", BACKENDS)
def test_processes_together_stay_within_the_sandbox_memory(
    data_dir: Path, backend: str, reliability: Reliability
) -> None:
    """Four processes of 100 MB each, every one under memory_mb (256 MB), 400 MB together: the OOM
    killer stops enough of them inside the sandbox; the host and the neighbouring sandbox go on."""
    with pool_of(data_dir, backend, memory_mb=256, work_size_mb=64, tmp_size_mb=32) as pool:
        with pool.acquire() as sandbox, pool.acquire() as neighbour:
            result = sandbox.run_python(TOGETHER)
            if result.status is CallStatus.MEMORY:  # the OOM killer took the interpreter itself
                finished = killed = 0
            else:
                assert result.status is CallStatus.OK, result
                codes = json.loads(result.value)
                finished, killed = codes.count(0), codes.count(-9)
                assert finished + killed == 4, codes
            within = result.status is CallStatus.MEMORY or finished * 100 < 256
            answered = sandbox.run_python("'alive'").value == "'alive'" and neighbour.run_python("1 + 1").value == "2"
        whole = healthy(pool)
        reliability.fault("processes together over the sandbox's memory", survived=within and answered and whole,
                          category=CATEGORY, backend=backend, finished=finished, oom_killed=killed)  # fmt: skip
        assert within, f"{finished} processes of 100 MB ran to the end in a sandbox of 256 MB: {result}"
        assert answered and whole, pool.status()


@pytest.mark.requires("cgroups")
def test_an_interpreter_killed_for_memory_is_reported_as_memory(data_dir: Path, reliability: Reliability) -> None:
    """150 MB of files in /work plus an interpreter growing to 200 MB: over the 320 MB budget though
    the interpreter alone stays under its address-space limit. It is killed, the call says MEMORY,
    and the episode goes on with its files."""
    with pool_of(data_dir, memory_mb=320, work_size_mb=160, tmp_size_mb=32) as pool, pool.acquire() as sandbox:
        ballast = sandbox.run_bash("for i in 1 2 3; do head -c 50M /dev/zero > ballast$i || exit 1; done")
        assert ballast.status is CallStatus.OK, ballast
        result = sandbox.run_python(
            "blocks = []\nfor _ in range(20):\n    blocks.append(b'x' * (10 << 20))\nlen(blocks)"
        )
        after = sandbox.run_bash("ls ballast* | wc -l")
        survived = result.status is CallStatus.MEMORY and after.stdout.strip() == "3"
        reliability.fault("interpreter over the sandbox's memory", survived=survived, category=CATEGORY,
                          status=result.status.value)  # fmt: skip
        assert result.status is CallStatus.MEMORY, result
        assert "out of memory" in result.detail and "320 MB" in result.detail, result.detail
        assert after.stdout.strip() == "3", after  # the work directory outlives the interpreter


# ---------------------------------------------------------------------------------- processes
BOMB = """
import os, time
started = refused = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
except OSError as exc:
    refused = exc.errno
started, refused
"""
NEIGHBOUR = "import subprocess\nprocs = [subprocess.Popen(['sleep', '60']) for _ in range(16)]\nlen(procs)"


@pytest.mark.requires("cgroups")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_bomb_stops_at_its_own_sandbox_budget(data_dir: Path, backend: str, reliability: Reliability) -> None:
    """A fork bomb whose processes stay alive: fork fails with EAGAIN at the sandbox's budget of
    32, and the neighbouring sandbox still starts 16 processes of its own."""
    with pool_of(data_dir, backend, max_processes=32) as pool:
        with pool.acquire() as bomb, pool.acquire() as neighbour:
            exploded = bomb.run_python(BOMB)
            assert exploded.status is CallStatus.OK, exploded
            started, refused = json.loads(exploded.value.replace("(", "[").replace(")", "]"))
            spared = neighbour.run_python(NEIGHBOUR)
        stopped = refused == errno.EAGAIN and started < 32
        whole = healthy(pool)
        reliability.fault("fork bomb beside another sandbox", survived=stopped and spared.value == "16" and whole,
                          category=CATEGORY, backend=backend, bomb_processes=started)  # fmt: skip
        assert stopped, exploded
        assert spared.value == "16", f"the neighbouring sandbox could not start its processes: {spared}"
        assert whole, pool.status()


# ---------------------------------------------------------------------------- work directory
FILL = """
import os
chunk = b"x" * (1 << 20)
written, failure = 0, None
try:
    for i in range(48):
        fd = os.open(f"fill-{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for _ in range(4):
                written += os.write(fd, chunk)
        finally:
            os.close(fd)
except OSError as exc:
    failure = exc.errno
[written, failure]
"""


def bytes_on_disk(directory: Path) -> int:
    """Bytes of files under ``directory`` on its own file system (mounted tmpfs left out)."""
    device, total = directory.stat().st_dev, 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if (Path(root) / d).stat().st_dev == device]
        total += sum((Path(root) / f).lstat().st_blocks * 512 for f in files)
    return total


@pytest.mark.requires("mount rights")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_work_directory_is_size_limited_and_off_the_host_disk(data_dir: Path, backend: str,
                                                                   reliability: Reliability) -> None:  # fmt: skip
    """Writing 192 MB into a 16 MB work directory fails with ENOSPC inside the sandbox; nothing of
    it lands on the host's disk; the sandbox goes on, and the host still sees the directory."""
    with pool_of(data_dir, backend, work_size_mb=16, file_size_mb=64) as pool, pool.acquire() as sandbox:
        before = bytes_on_disk(pool.directory)
        result = sandbox.run_python(FILL)
        assert result.status is CallStatus.OK, result
        written, failure = json.loads(result.value.replace("None", "null"))
        landed = bytes_on_disk(pool.directory) - before
        (sandbox.work_dir / "fill-0").unlink()  # the host's view of the same directory
        answered = sandbox.run_python("import os\nsorted(os.listdir('.'))[:1]").value == "['fill-1']"
        refused = failure == errno.ENOSPC and written <= 16 * MB
        reliability.inputs("sandbox work directory past its size", tried=1, refused_cleanly=int(refused and landed < MB),
                           category=CATEGORY, backend=backend, written_mb=written / MB, host_disk_bytes=landed)  # fmt: skip
        assert refused, f"wrote {written / MB:.0f} MB into a 16 MB work directory (errno {failure})"
        assert landed < MB, f"{landed} bytes of the sandbox's files landed on the host's disk"
        assert answered


# ---------------------------------------------------------------------------------- system calls
PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def in_child(attempt):
    # errno of attempt() in a forked child (0: it worked), so that a call that works changes nothing here
    pid = os.fork()
    if pid == 0:
        ctypes.set_errno(0)
        os._exit(0 if attempt() >= 0 else min(ctypes.get_errno(), 255))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

def syscall(nr, *args):
    return lambda: libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))

numbers, refused = json.loads(sys.argv[1]), json.loads(sys.argv[2])
probes = {
    "unshare(CLONE_NEWUSER)": syscall(numbers["unshare"], 0x10000000),
    "clone(CLONE_NEWUSER)": syscall(numbers["clone"], 0x10000000 | 17, 0, 0, 0, 0),
    "ptrace(PTRACE_TRACEME)": syscall(numbers["ptrace"], 0, 0, 0, 0),
    "mount(tmpfs)": lambda: libc.mount(b"none", b"/work/no-such-dir", b"tmpfs", 0, None),
    "keyctl(KEYCTL_JOIN_SESSION_KEYRING)": syscall(numbers["keyctl"], 1, 0),
    "bpf(any command)": syscall(numbers["bpf"], 9999, 0, 0),
}
for name in refused:
    probes.setdefault(name, syscall(numbers[name], 0, 0, 0, 0, 0, 0))
print(json.dumps({name: in_child(attempt) for name, attempt in probes.items()}))
"""
EVERYDAY = """
import os, subprocess, threading
thread = threading.Thread(target=len, args=("",))
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
subprocess.run(["true"]).returncode
"""
SHELL_ATTEMPTS = {
    "unshare -U": "unshare -U true",
    "mount in a new user and mount namespace": "unshare -Urm sh -c 'mount -t tmpfs none /tmp'",
}


def test_namespace_and_kernel_calls_are_refused(data_dir: Path, reliability: Reliability) -> None:
    """New user namespaces (unshare, clone), ptrace, mount, keyctl, bpf and every other call on the
    filter's list fail with EPERM inside the sandbox; threads, fork and subprocesses still work."""
    arch = seccomp.native_arch()
    assert arch is not None, "no seccomp program is written for this machine"
    with pool_of(data_dir) as pool, pool.acquire() as sandbox:
        assert sandbox.write_file("probe.py", PROBE).ok
        numbers, refused = json.dumps(arch.numbers), json.dumps(list(seccomp.REFUSED))
        probed = sandbox.run_bash(f"python3 probe.py '{numbers}' '{refused}'")
        assert probed.status is CallStatus.OK, probed
        errnos = json.loads(probed.stdout)
        shell = {name: sandbox.run_bash(command) for name, command in SHELL_ATTEMPTS.items()}
        everyday = sandbox.run_python(EVERYDAY)
    allowed = {name: code for name, code in errnos.items() if code != errno.EPERM}
    shell_ran = {name: r.stderr for name, r in shell.items() if r.exit_code == 0 or "not permitted" not in r.stderr}
    reliability.inputs("sandbox system calls", tried=len(errnos) + len(shell),
                       refused_cleanly=len(errnos) - len(allowed) + len(shell) - len(shell_ran),
                       category=CATEGORY, arch=arch.name, not_refused=sorted(allowed) + sorted(shell_ran))  # fmt: skip
    assert not allowed, f"not refused with EPERM (0: the call worked): {allowed}"
    assert not shell_ran, shell_ran
    assert everyday.status is CallStatus.OK and everyday.value == "0", everyday


# --------------------------------------------------------------------------- one cgroup each
@pytest.mark.requires("cgroups", "mount rights")
def test_each_sandbox_has_its_own_cgroup_and_tmpfs_removed_with_it(data_dir: Path, reliability: Reliability) -> None:
    host = detect()
    assert isinstance(host, CgroupHost)
    with pool_of(data_dir) as pool:
        names = set()
        for pid in pool.host_pids():
            found = re.findall(r"/(posttrain-\d+-\d+)$", Path(f"/proc/{pid}/cgroup").read_text(), re.MULTILINE)
            assert found, f"sandbox process {pid} is in no cgroup of its own"
            names.update(found)
        directory = str(pool.directory)
        mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if directory in line]
        assert len(names) == pool.config.pool_size, names
        assert len(mounted) == pool.config.pool_size and all(" - tmpfs " in line for line in mounted), mounted
    left = [name for name in names for parent in (host.memory_parent, host.pids_parent) if (parent / name).exists()]
    still_mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if directory in line]
    reliability.fault("sandbox cgroups and work mounts removed with the pool", survived=not left and not still_mounted,
                      category=CATEGORY)  # fmt: skip
    assert not left and not still_mounted, (left, still_mounted)


@pytest.mark.requires("cgroups", "mount rights")
def test_what_a_dead_process_left_is_removed_by_the_next(data_dir: Path, reliability: Reliability) -> None:
    """A process killed with its pool (a Ray actor, a verifier worker) leaves empty cgroups and mounted
    work directories; the next pool removes them, wherever that pool's data directory was."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = detect()
    assert isinstance(host, CgroupHost)
    groups = {host.memory_parent / f"posttrain-{gone.pid}-0", host.pids_parent / f"posttrain-{gone.pid}-0"}
    for group in groups:
        group.mkdir()
    stale_pool = data_dir / "another-data-dir" / f"pool-{gone.pid}-gone"
    (stale_pool / "slot-0" / "work").mkdir(parents=True)
    workdir.mount_tmpfs(stale_pool / "slot-0" / "work", 1, None)
    (stale_pool / "slot-0" / "work" / "left-over").write_text("x")
    detect.cache_clear()
    limits._confinement.cache_clear()
    with pool_of(data_dir) as pool:
        assert healthy(pool)
    mounted = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(stale_pool) in line]
    left = [str(g) for g in groups if g.exists()] + ([str(stale_pool)] if stale_pool.exists() else []) + mounted
    reliability.fault("leftovers of a pool that died", survived=not left, category=CATEGORY)
    assert not left, left


def test_without_cgroups_the_status_says_what_is_weaker(data_dir: Path, caplog: pytest.LogCaptureFixture,
                                                         reliability: Reliability) -> None:  # fmt: skip
    """With cgroups turned off the pool falls back to rlimits, logs that once, shows it in its status,
    and the rlimits still stop a fork bomb."""
    limits._confinement.cache_clear()
    with caplog.at_level(logging.WARNING, logger=limits.__name__):
        with pool_of(data_dir, use_cgroups=False, max_processes=32) as pool, pool_of(data_dir, use_cgroups=False,
                                                                                      max_processes=32):  # fmt: skip
            line = pool.status().limits["memory_and_processes"]
            with pool.acquire() as sandbox:
                exploded = sandbox.run_python(BOMB)
    notes = [r.getMessage() for r in caplog.records if "memory_and_processes" in r.getMessage()]
    started, refused = json.loads(exploded.value.replace("(", "[").replace(")", "]"))
    reliability.fault("cgroups unavailable: rlimit fallback", survived=refused == errno.EAGAIN and len(notes) == 1,
                      category=CATEGORY, note=line)  # fmt: skip
    assert line.startswith("weaker: rlimits per process only") and "turned off (sandbox.use_cgroups)" in line, line
    assert len(notes) == 1, notes  # two pools, one note
    assert refused == errno.EAGAIN and started < 32, exploded
