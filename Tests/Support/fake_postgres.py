#!/usr/bin/env python3
"""A misbehaving PostgreSQL server on 127.0.0.1, for tests of the client's defences.

    fake_postgres.py PORT silent        accept connections and never answer
    fake_postgres.py PORT reject-sql    finish the start-up handshake, then answer
                                        every query with an error

Prints "ready" once listening; exits after 120 s or when stdin closes.
"""
import socket
import struct
import sys
import threading
import time


def message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def read_exact(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def reject_sql(conn: socket.socket) -> None:
    while True:
        length, code = struct.unpack("!II", read_exact(conn, 8))
        read_exact(conn, length - 8)
        if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not offered
            conn.sendall(b"N")
            continue
        break
    conn.sendall(
        message(b"R", struct.pack("!I", 0))
        + message(b"S", b"server_version\x0015.0\x00")
        + message(b"S", b"client_encoding\x00UTF8\x00")
        + message(b"K", struct.pack("!II", 4242, 1))
        + message(b"Z", b"I")
    )
    while True:
        kind = read_exact(conn, 1)
        (length,) = struct.unpack("!I", read_exact(conn, 4))
        read_exact(conn, length - 4)
        if kind == b"X":
            return
        error = b"SERROR\x00VERROR\x00C42000\x00Mthis fake server refuses every statement\x00\x00"
        conn.sendall(message(b"E", error) + message(b"Z", b"I"))


def serve(conn: socket.socket, mode: str) -> None:
    try:
        if mode == "reject-sql":
            reject_sql(conn)
        else:
            time.sleep(120)
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    threading.Thread(target=lambda: (sys.stdin.read(), listener.close()), daemon=True).start()
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    listener.settimeout(1)
    while time.monotonic() < deadline:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except OSError:
            return
        threading.Thread(target=serve, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()
