"""Put this folder on PYTHONPATH and, in that Python process, every host name ending in
`.invalid` fails to resolve as a name the DNS does not know, without a DNS query leaving the
machine. Tests use it to see what blobmount says about a name that does not resolve."""

from __future__ import annotations

import socket

_real_getaddrinfo = socket.getaddrinfo


def _getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode("ascii", "replace") if isinstance(host, bytes) else host
    if isinstance(name, str) and name.endswith(".invalid"):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
