"""The master port of an attempt whose rendezvous task declared none.

Chosen once, as a free port of this machine, and kept in the attempt's directory, so
every task of the attempt (and a launcher restarted between two of its launches) reads
the same number. A free port can still be taken by someone else before the master
binds it; a role that declares a port (placement reserves it per node) avoids that.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

PORT_FILE = "master-port"


def free_port(host_ip: str) -> int:
    for host in (host_ip, "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, 0))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL and host != "0.0.0.0":
                    continue  # a simulated node's address: any port of this machine
                raise
            return int(sock.getsockname()[1])
    raise OSError(errno.EADDRNOTAVAIL, f"no free port on {host_ip}")


def reserve_port(attempt_dir: Path, host_ip: str) -> int:
    path = attempt_dir / PORT_FILE
    try:
        return int(path.read_text())
    except FileNotFoundError:
        pass
    attempt_dir.mkdir(parents=True, exist_ok=True)
    tmp = attempt_dir / f".{PORT_FILE}.{os.getpid()}"
    tmp.write_text(f"{free_port(host_ip)}\n")
    try:
        # A hard link creates the file only if it is absent: the first choice stands.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return int(path.read_text())
