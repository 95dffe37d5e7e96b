"""The sandbox's init: the first program every sandbox runs, with the sandbox's own Python (``/usr/bin/python3``,
standard library only; this file is mounted read-only at ``/run/crucible/init.py``).

``python3 -I -B init.py [--socket PATH --port N] [--user UID] [--stage SRC DST]... [--status FILE] --cpu-s S --memory-mb M
--fsize-mb F [--wall-s W] -- ARGV...``

0. With ``--seccomp FILE`` (the Docker backend): loads that BPF program as its seccomp filter, on top of the
   runtime's, before anything else, so the calls :mod:`grader.sandboxes.seccomp` refuses are refused in both backends'
   sandboxes (bubblewrap loads it itself).
   With ``--stage`` (the Docker backend's writable mounts): copies each directory ``SRC`` (a bind mount of the host's
   workspace, under a directory only root may enter) into ``DST`` (a tmpfs of the run's disk size, the kernel's limit),
   as ``UID``, before anything else runs; after the command (and every process it left, killed) it copies ``DST`` back
   over ``SRC``, as ``UID`` again, and writes ``{"limit": "wall" | "disk" | null}`` to ``FILE``. The copies go through
   a descriptor of ``SRC`` that only this process and its copier hold: the command can neither see ``SRC`` nor grow it
   past ``DST``'s size (files it unlinked while holding them open count against the tmpfs and are not copied).

1. Sets, in the command's process, the resource limits everything it starts inherits: ``RLIMIT_CPU`` (``S`` seconds, soft = hard,
   so the kernel kills at the limit), ``RLIMIT_AS`` (``M`` MiB), ``RLIMIT_FSIZE`` (``F`` MiB per file written), no
   core files.
2. With ``--socket``: listens on ``127.0.0.1:N`` inside the sandbox's own network namespace (loopback only) and
   forwards each connection, byte for byte, to the Unix socket ``PATH`` — the rollout's own model-endpoint socket,
   bind-mounted in by the backend (which caps the rollout's connections, request sizes and times), on one event loop.
   That is the sandbox's only way out, and it reaches that endpoint alone.
3. Runs ``ARGV`` with this process's stdin, stdout and stderr, as ``UID`` (group ``UID``, no supplementary groups;
   the kernel clears every capability on the switch from root) when ``--user`` is given, waits for it, and exits with
   its status (``128 + n`` when a signal ``n`` ended it), or with 137 after ``W`` seconds. When this process exits everything left in the
   sandbox ends (the PID namespace's init dies, or the container stops). The backend enforces the wall limit from
   outside; this one (a little longer) bounds a sandbox whose grader died.
"""

import argparse
import asyncio
import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> None:
    """Copy one connection to the Unix socket ``path`` and back, byte for byte, until either side closes."""
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return

    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()

    await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))


def _serve(listener: socket.socket, path: str) -> None:
    """Forward every connection to ``listener`` to ``path``, on one thread (an event loop): connections cost no
    threads, so a harness holding many counts against nothing but the endpoint's own cap on them."""
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: _forward(r, w, path), sock=listener)
        await server.serve_forever()

    asyncio.run(main())


def _as_user(uid: int | None) -> dict:
    """``subprocess`` arguments that start a process as ``uid`` (group ``uid``, no supplementary groups); none for
    ``None`` (as this process)."""
    return {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}


def _as(uid: int | None, argv: list[str], pass_fds: tuple[int, ...] = ()) -> int:
    """Run ``argv`` as ``uid`` (as this process when ``None``); its exit status."""
    return subprocess.run(argv, pass_fds=pass_fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, **_as_user(uid)).returncode


def _copy(uid: int | None, src: str, dst: str, fd: int, inward: bool) -> None:
    """Copy the tree of ``src`` into ``dst`` (``inward``), or of ``dst`` over ``src``, through ``fd`` (an open
    descriptor of ``src``): as ``uid``, so every copied file is that user's (a set-user-ID bit makes no one else of
    it); links are copied as links, never followed; what ``uid`` cannot read is left out."""
    staged = f"/proc/self/fd/{fd}"
    if inward:
        _as(uid, ["cp", "-a", "--no-preserve=ownership", "--", f"{staged}/.", dst], (fd,))
    else:
        _as(uid, ["find", f"{staged}/", "-mindepth", "1", "-delete"], (fd,))
        _as(uid, ["cp", "-a", "--no-preserve=ownership", "--", f"{dst}/.", f"{staged}/"], (fd,))


def _kill_all() -> None:
    """Kill every process of the sandbox but this one (``kill(-1)`` from its first process; the Docker backend keeps
    ``CAP_KILL`` for this init alone, to reach the run user's processes without starting one, which a run at its
    process limit would refuse), until none is left."""
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError:
            pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.02)


def _load_seccomp(path: str) -> None:
    """Load the BPF program in ``path`` (:mod:`grader.sandboxes.seccomp`'s, built by the grader) as this process's
    seccomp filter, inherited by everything it starts; on top of any filter already there (the container runtime's),
    so a call either refuses is refused."""
    with open(path, "rb") as handle:
        program = handle.read()

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = SockFprog(len(program) // 8, program)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER (no_new_privs is set)
        raise OSError(ctypes.get_errno(), "the sandbox's seccomp filter could not be loaded")


def _full(path: str) -> bool:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize < 64 * 1024


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--user", type=int)
    parser.add_argument("--stage", nargs=2, action="append", default=[], metavar=("SRC", "DST"))
    parser.add_argument("--status")
    parser.add_argument("--seccomp")
    parser.add_argument("--cpu-s", type=float, required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--fsize-mb", type=int, required=True)
    parser.add_argument("--wall-s", type=float)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    stages = [(src, dst, os.open(src, os.O_RDONLY | os.O_DIRECTORY)) for src, dst in args.stage]
    for src, dst, fd in stages:
        _copy(args.user, src, dst, fd, inward=True)
    if args.seccomp:
        _load_seccomp(args.seccomp)
    if args.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", args.port))
        listener.listen(64)
        threading.Thread(target=_serve, args=(listener, args.socket), daemon=True).start()
    cpu = int(args.cpu_s) + 1
    limits = ((resource.RLIMIT_AS, args.memory_mb * 1024 * 1024), (resource.RLIMIT_FSIZE, args.fsize_mb * 1024 * 1024),
              (resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu))

    def limited() -> None:  # the command's limits, set in its process alone: the copy back is the platform's work
        for limit, value in limits:
            resource.setrlimit(limit, (value, value))

    try:
        proc = subprocess.Popen(argv, close_fds=True, preexec_fn=limited, **_as_user(args.user))  # noqa: PLW1509 - only setrlimit
    except OSError as exc:
        print(f"crucible sandbox: cannot start {argv[:1]}: {exc}", file=sys.stderr)
        return 127
    limit, filled = None, False
    if stages:  # a staged workspace seen full while the run goes on is the disk limit (files held open and unlinked are
        deadline = time.monotonic() + args.wall_s if args.wall_s else None  # freed at its end): polled
        while (status := proc.poll()) is None and (deadline is None or time.monotonic() <= deadline):
            filled = filled or any(_full(dst) for _, dst, _ in stages)
            time.sleep(0.05)
    else:
        try:
            status = proc.wait(timeout=args.wall_s)
        except subprocess.TimeoutExpired:
            status = None
    if status is None:
        limit, code = "wall", 137
    else:
        code = 128 - status if status < 0 else status
    if stages:
        _kill_all()
        if limit is None and (filled or any(_full(dst) for _, dst, _ in stages)):
            limit = "disk"
        for src, dst, fd in stages:
            _copy(args.user, src, dst, fd, inward=False)
    if args.status:
        with open(args.status, "w") as out:
            json.dump({"limit": limit}, out)
    return code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
