"""A pure-Python client of c10d's TCPStore wire protocol, for the scale simulation (bench_scale.py).

The protocol as gpuguard's C++ client speaks it (csrc/gpuguard/tcp_store_client.cc says where each part comes
from in torch's sources): a request is a query byte and its arguments, a string a uint64 length and its bytes,
numbers in the host's byte order; every key goes out as "/" + key, as torch's client sends it, so a key set here is
the key torch's ``store.get()`` reads. A ``get`` waits for its key first (WAIT, then GET), and a wait that times out
is cancelled on the server (CANCEL_WAIT), as torch's client does.

It offers what gpuguard's placement check calls on a ``torch.distributed.TCPStore`` (set, get, add, compare_set,
check, wait, delete_key, timeout, set_timeout), built on the ``socket`` module alone, so that under gevent's
monkey patching thousands of simulated ranks, each with a connection of its own, share one thread. It counts the
operations it is asked for (``ops``) and the requests it sends (``requests``: a get is two).
"""

from __future__ import annotations

import datetime
import itertools
import os
import socket
import struct
from typing import Optional, Union

VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY = range(9)
CANCEL_WAIT, PING = 12, 13
STOP_WAITING, WAIT_CANCELED = 0, 1
CHECK_READY, CHECK_NOT_READY = 0, 1
MAGIC = 0x3C85F7CE
#: How long the server gets to confirm a CANCEL_WAIT (as gpuguard's C++ client).
CANCEL_GRACE_S = 5.0

_U8, _U32, _U64, _I64 = struct.Struct("=B"), struct.Struct("=I"), struct.Struct("=Q"), struct.Struct("=q")
_nonces = itertools.count(os.getpid() * 7919)

Bytes = Union[bytes, str]


def _string(data: Bytes) -> bytes:
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return _U64.pack(len(raw)) + raw


def _key(key: str) -> bytes:
    return _string("/" + key)


class StoreTimeout(RuntimeError):
    """A wait that ran past the store's timeout (its text says "timeout", as c10d's DistStoreError does)."""


class WireStore:
    """One connection to a TCPStore server. Not shared between ranks: each simulated rank makes its own."""

    def __init__(self, host: str, port: int, timeout: float = 300.0) -> None:
        self._timeout = datetime.timedelta(seconds=timeout)
        self.ops = 0
        self.requests = 0
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        nonce = next(_nonces) & 0xFFFFFFFF
        self._send(_U8.pack(VALIDATE) + _U32.pack(MAGIC) + _U8.pack(PING) + _U32.pack(nonce), requests=2)
        if _U32.unpack(self._recv(4))[0] != nonce:
            raise RuntimeError(f"the server at {host}:{port} did not echo the PING: not a TCPStore")

    # ---- the connection -----------------------------------------------------------------------------------

    def close(self) -> None:
        self._sock.close()

    def _send(self, data: bytes, requests: int = 1) -> None:
        self.requests += requests
        self._sock.settimeout(self._timeout.total_seconds())
        self._sock.sendall(data)

    def _recv(self, size: int, seconds: float = 0.0) -> bytes:
        self._sock.settimeout(seconds or self._timeout.total_seconds())
        chunks = []
        while size:
            chunk = self._sock.recv(size)
            if not chunk:
                raise ConnectionError("the TCPStore server closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _recv_bytes(self) -> bytes:
        return self._recv(_U64.unpack(self._recv(8))[0])

    def _wait(self, keys: list[str], seconds: float) -> None:
        self._send(_U8.pack(WAIT) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        try:
            answer = self._recv(1, max(seconds, 0.001))[0]
        except socket.timeout:
            self._send(_U8.pack(CANCEL_WAIT))
            answer = self._recv(1, CANCEL_GRACE_S)[0]
            if answer == STOP_WAITING:  # the keys came as the cancel went out
                self._recv(1, CANCEL_GRACE_S)
                return
            raise StoreTimeout(f"wait timeout after {seconds * 1e3:.0f}ms, keys: {keys}") from None
        if answer != STOP_WAITING:
            raise RuntimeError(f"the server answered WAIT with byte {answer}")

    # ---- what gpuguard calls ------------------------------------------------------------------------------

    @property
    def timeout(self) -> datetime.timedelta:
        return self._timeout

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout

    def set(self, key: str, value: Bytes) -> None:
        self.ops += 1
        self._send(_U8.pack(SET) + _key(key) + _string(value))

    def get(self, key: str) -> bytes:
        self.ops += 1
        self._wait([key], self._timeout.total_seconds())
        self._send(_U8.pack(GET) + _key(key))
        return self._recv_bytes()

    def add(self, key: str, amount: int) -> int:
        self.ops += 1
        self._send(_U8.pack(ADD) + _key(key) + _I64.pack(amount))
        return int(_I64.unpack(self._recv(8))[0])

    def compare_set(self, key: str, expected: Bytes, desired: Bytes) -> bytes:
        self.ops += 1
        self._send(_U8.pack(COMPARE_SET) + _key(key) + _string(expected) + _string(desired))
        return self._recv_bytes()

    def check(self, keys: list[str]) -> bool:
        self.ops += 1
        if not keys:
            return True
        self._send(_U8.pack(CHECK) + _U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        answer = self._recv(1)[0]
        if answer not in (CHECK_READY, CHECK_NOT_READY):
            raise RuntimeError(f"the server answered CHECK with byte {answer}")
        return answer == CHECK_READY

    def wait(self, keys: list[str], timeout: Optional[datetime.timedelta] = None) -> None:
        self.ops += 1
        self._wait(list(keys), (timeout or self._timeout).total_seconds())

    def delete_key(self, key: str) -> bool:
        self.ops += 1
        self._send(_U8.pack(DELETE_KEY) + _key(key))
        return bool(_I64.unpack(self._recv(8))[0])
