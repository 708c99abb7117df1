"""Sends N keep-alive GET requests to 127.0.0.1:PORT, one at a time, and
reads each response whole; with --users, an x-user header over 1,000 users
(as the load harness sends). Used by server.sh under callgrind."""
import socket
import sys
import time

port, n = int(sys.argv[1]), int(sys.argv[2])
users = "--users" in sys.argv[3:]
deadline = time.monotonic() + 60
while True:
    try:
        conn = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(f"no server on port {port}")
        time.sleep(0.2)
buf = b""
for i in range(n):
    user = b"x-user: user-%d\r\n" % (i % 1000) if users else b""
    conn.sendall(b"GET / HTTP/1.1\r\nhost: bench\r\n" + user + b"\r\n")
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) >= end + 4 + length:
                buf = buf[end + 4 + length:]
                break
        chunk = conn.recv(65536)
        if not chunk:
            sys.exit("the server closed the connection")
        buf += chunk
