"""The sandbox's init: the first program every sandbox runs, with the sandbox's own Python (``/usr/bin/python3``,
standard library only; this file is mounted read-only at ``/run/crucible/init.py``).

``python3 -I -B init.py [--socket PATH --port N] --cpu-s S --memory-mb M --fsize-mb F [--wall-s W] -- ARGV...``

1. Sets the per-process resource limits every later process inherits: ``RLIMIT_CPU`` (``S`` seconds, soft = hard,
   so the kernel kills at the limit), ``RLIMIT_AS`` (``M`` MiB), ``RLIMIT_FSIZE`` (``F`` MiB per file written), no
   core files.
2. With ``--socket``: listens on ``127.0.0.1:N`` inside the sandbox's own network namespace (loopback only) and
   forwards each connection, byte for byte, to the Unix socket ``PATH`` — the rollout's own model-endpoint socket,
   bind-mounted in by the backend (which caps the connections, request sizes and times of the rollout). That is the sandbox's only way out, and it reaches that endpoint alone.
3. Runs ``ARGV`` with this process's stdin, stdout and stderr, waits for it, and exits with its status (``128 + n``
   when a signal ``n`` ended it), or with 137 after ``W`` seconds. When this process exits everything left in the
   sandbox ends (the PID namespace's init dies, or the container stops). The backend enforces the wall limit from
   outside; this one (a little longer) bounds a sandbox whose grader died.
"""

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import threading


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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--cpu-s", type=float, required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--fsize-mb", type=int, required=True)
    parser.add_argument("--wall-s", type=float)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if args.socket:  # listen before the limits: the forwarder is the platform's, not the harness's
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", args.port))
        listener.listen(64)
        threading.Thread(target=_serve, args=(listener, args.socket), daemon=True).start()
    cpu = int(args.cpu_s) + 1
    for limit, value in ((resource.RLIMIT_AS, args.memory_mb * 1024 * 1024), (resource.RLIMIT_FSIZE, args.fsize_mb * 1024 * 1024),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu)):
        resource.setrlimit(limit, (value, value))
    try:
        proc = subprocess.Popen(argv, close_fds=True)
    except OSError as exc:
        print(f"crucible sandbox: cannot start {argv[:1]}: {exc}", file=sys.stderr)
        return 127
    try:
        status = proc.wait(timeout=args.wall_s)
    except subprocess.TimeoutExpired:
        return 137
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main())
