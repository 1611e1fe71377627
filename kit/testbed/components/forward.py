"""Carry one loopback port into a network namespace: ``127.0.0.1:PORT`` inside it reaches ``127.0.0.1:PORT`` outside.

A process run in a network namespace of its own (``ip netns exec``) has a loopback of its own:
whatever it listens on, even ``*:port``, nobody outside can reach, and it cannot reach the
host's ``127.0.0.1`` either. This forwarder gives it exactly one way out, to one host port:

- it starts in the host's network namespace, enters the target namespace (``setns(2)`` through
  libc, as Python 3.11 has no ``os.setns``) just long enough to bind a listening socket on that
  namespace's ``127.0.0.1:PORT``, then returns to the host's namespace;
- for each connection accepted there it opens a connection to the host's ``127.0.0.1:PORT``
  (a socket belongs to the namespace it was created in) and copies bytes both ways.

So the kube-apiserver URL ``https://127.0.0.1:PORT`` means the same API server inside and outside
the namespace, with the same TLS name. Nothing here listens on or dials any other address.

``python -m testbed.components.forward <netns> <port> [<parent pid>]`` runs it; it prints ``ready`` once
listening, and ends with its parent (``PR_SET_PDEATHSIG``), so a killed test session leaves none behind.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


def listen_in(netns: str, port: int) -> socket.socket:
    """A socket listening on ``127.0.0.1:port`` of network namespace ``netns``; the caller stays in its own."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen(64)
        finally:
            _setns(home)
    finally:
        os.close(home)
        os.close(target)
    return server


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _serve_one(inside: socket.socket, port: int) -> None:
    try:
        outside = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        inside.close()
        return
    splice(inside, outside)


def splice(inside: socket.socket, outside: socket.socket) -> None:
    """Copy bytes both ways between two connected sockets until both directions end, then close both."""
    outside.settimeout(None)
    back = threading.Thread(target=_pipe, args=(outside, inside), daemon=True)
    back.start()
    _pipe(inside, outside)
    back.join()
    inside.close()
    outside.close()


def _die_with(parent: int) -> None:
    """SIGTERM this process when its parent dies (and exit now if it already has)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(1)


def serve(netns: str, port: int, parent: int | None = None) -> None:
    if parent is not None:
        _die_with(parent)
    server = listen_in(netns, port)
    print("ready", flush=True)
    while True:
        connection, _ = server.accept()
        threading.Thread(target=_serve_one, args=(connection, port), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
