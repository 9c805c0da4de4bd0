"""Socket, selectors, asyncio and subprocess use, as a Python program does it.

Run by test/shim (TestPython) bare and under the preload; the output must be
the same. Every transfer is checked; any error exits non-zero. Loopback only,
ephemeral ports.
"""

import asyncio
import hashlib
import os
import selectors
import socket
import subprocess
import sys
import threading


def payload(n, seed):
    h = hashlib.sha256(str(seed).encode()).digest()
    return (h * (n // len(h) + 1))[:n]


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)


def echo_server(family, host):
    srv = socket.create_server((host, 0), family=family)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()  # accept4(SOCK_CLOEXEC) in CPython
        conn.settimeout(10)  # lost data fails, not hangs
        with conn:
            while True:
                b = conn.recv(65536)
                if not b:
                    break
                conn.sendall(b)
        srv.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return port, th


def blocking_sockets():
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        port, th = echo_server(family, host)
        c = socket.create_connection((host, port), timeout=10)  # poll before each op
        digest = hashlib.sha256()
        total = 0
        for i in range(200):
            data = payload(1 + (i * 977) % 30000, i)
            c.sendall(data)
            got = bytearray()
            while len(got) < len(data):
                chunk = c.recv(len(data) - len(got))
                check(chunk, "early EOF")
                got += chunk
            check(bytes(got) == data, "echo mismatch")
            digest.update(got)
            total += len(got)
        # sendmsg / recvmsg / recv_into / MSG_PEEK
        c.sendmsg([b"scatter-", b"gather"])
        buf = bytearray(14)
        n = 0
        peek = c.recv(3, socket.MSG_PEEK | socket.MSG_WAITALL)
        while n < 14:
            n += c.recv_into(memoryview(buf)[n:], 14 - n)
        check(peek == b"sca" and bytes(buf) == b"scatter-gather", "sendmsg echo")
        c.sendall(b"m" * 10)
        msg, _, flags, _ = c.recvmsg(10, 0, socket.MSG_WAITALL)
        check(msg == b"m" * 10, "recvmsg")
        # makefile / readline
        f = c.makefile("rwb")
        f.write(b"line one\nline two\n")
        f.flush()
        check(f.readline() == b"line one\n" and f.readline() == b"line two\n", "readline")
        f.close()
        c.shutdown(socket.SHUT_WR)
        check(c.recv(10) == b"", "EOF after shutdown")
        c.close()
        th.join()
        name = "tcp4" if family == socket.AF_INET else "tcp6"
        print(f"{name} blocking: 200 messages, {total} bytes, sha256 {digest.hexdigest()[:16]}")

    # Non-blocking and timeouts
    a, b = socket.socketpair()
    a.setblocking(False)  # ioctl(FIONBIO)
    try:
        a.recv(10)
        check(False, "non-blocking recv on empty socket did not raise")
    except BlockingIOError:
        print("socketpair non-blocking recv: BlockingIOError")
    b.settimeout(0.05)
    try:
        b.recv(10)
        check(False, "timeout did not raise")
    except socket.timeout:
        print("socketpair recv timeout: timeout")
    a.close()
    b.close()
    # UDP
    u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u1.bind(("127.0.0.1", 0))
    u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(10):
        u2.sendto(payload(100 + i, i), u1.getsockname())
        d, addr = u1.recvfrom(2048)
        check(d == payload(100 + i, i) and addr[1] == u2.getsockname()[1], "udp")
    print("udp: 10 datagrams, sources match")
    u1.close()
    u2.close()


def selector_echo():
    sel = selectors.DefaultSelector()  # epoll
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ, "listen")
    clients = []
    for i in range(4):
        c = socket.socket()
        c.setblocking(False)
        err = c.connect_ex(lsock.getsockname())
        check(err in (0, 115), f"connect_ex {err}")  # 115 = EINPROGRESS
        clients.append(c)
    want = {i: payload(50000 + i, 100 + i) for i in range(4)}
    sent = {i: 0 for i in range(4)}
    got = {i: bytearray() for i in range(4)}
    for i, c in enumerate(clients):
        sel.register(c, selectors.EVENT_READ | selectors.EVENT_WRITE, ("client", i))
    accepted = 0
    while any(len(got[i]) < len(want[i]) for i in range(4)):
        for key, ev in sel.select(timeout=10) or [(None, 0)]:
            check(key is not None, "selector timed out")
            if key.data == "listen":
                s, _ = lsock.accept()
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, ("server", accepted))
                accepted += 1
            elif key.data[0] == "server":
                s = key.fileobj
                try:
                    b = s.recv(65536)
                except BlockingIOError:
                    continue
                if not b:
                    sel.unregister(s)
                    s.close()
                    continue
                s.setblocking(True)
                s.sendall(b)
                s.setblocking(False)
            else:
                i = key.data[1]
                c = key.fileobj
                if ev & selectors.EVENT_WRITE and sent[i] < len(want[i]):
                    try:
                        sent[i] += c.send(want[i][sent[i]:sent[i] + 8192])
                    except BlockingIOError:
                        pass
                    if sent[i] == len(want[i]):
                        sel.modify(c, selectors.EVENT_READ, key.data)
                if ev & selectors.EVENT_READ:
                    try:
                        got[i] += c.recv(65536)
                    except BlockingIOError:
                        pass
    for i, c in enumerate(clients):
        check(bytes(got[i]) == want[i], f"selector client {i} data")
        sel.unregister(c)
        c.close()
    sel.unregister(lsock)
    lsock.close()
    sel.close()
    print(f"selectors ({type(sel).__name__}): 4 clients, {sum(len(w) for w in want.values())} bytes echoed")


async def asyncio_main():
    async def handle(reader, writer):
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(line.upper())
            await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def client(i):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []
        for k in range(50):
            writer.write(f"client {i} line {k} {'x' * (k * 37)}\n".encode())
            await writer.drain()
            out.append(await reader.readline())
        writer.close()
        await writer.wait_closed()
        check(all(o == f"CLIENT {i} LINE {k} {'X' * (k * 37)}\n".encode() for k, o in enumerate(out)),
              "asyncio echo")
        return len(out)

    counts = await asyncio.gather(*(client(i) for i in range(4)))
    server.close()
    await server.wait_closed()
    # a subprocess from asyncio
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate(b"olleh")
    check(proc.returncode == 0 and out == b"hello\n", "asyncio subprocess")
    print(f"asyncio: {len(counts)} clients x {counts[0]} lines echoed; subprocess: {out.decode().strip()}")


def subprocesses():
    r = subprocess.run([sys.executable, "-c", "print('child python ok')"], capture_output=True, check=True)
    print("subprocess.run:", r.stdout.decode().strip())
    r = subprocess.run(["sh", "-c", "echo hi | cat"], capture_output=True, check=True)
    print("sh pipeline:", r.stdout.decode().strip())
    data = payload(300000, 7)
    p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = p.communicate(data)
    check(p.returncode == 0 and out == data, "cat round trip")
    print(f"Popen cat: {len(out)} bytes round trip")
    # close_fds=True (the default) uses close_range in the child: an
    # inheritable fd of ours must not reach it; pass_fds must.
    rfd, wfd = os.pipe()
    os.set_inheritable(rfd, True)
    os.set_inheritable(wfd, True)
    probe = "import os,sys; print([os.path.exists(f'/proc/self/fd/{a}') for a in sys.argv[1:]])"
    r = subprocess.run([sys.executable, "-c", probe, str(rfd), str(wfd)],
                       capture_output=True, check=True, close_fds=True, pass_fds=(wfd,))
    os.close(rfd)
    os.close(wfd)
    print("close_fds child sees [closed, passed]:", r.stdout.decode().strip())
    # A child that is itself a socket program, talking to us over TCP.
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c",
                              "import socket,sys; c=socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
                              "c.sendall(b'from child'); c.close()", str(port)])
    conn, _ = srv.accept()
    got = b""
    while True:
        b = conn.recv(100)
        if not b:
            break
        got += b
    conn.close()
    srv.close()
    check(child.wait() == 0 and got == b"from child", "socket child")
    print("child over TCP:", got.decode())


def main():
    socket.setdefaulttimeout(10)  # any lost byte fails within 10 s
    blocking_sockets()
    selector_echo()
    asyncio.run(asyncio_main())
    subprocesses()
    print("python: all checks passed")


if __name__ == "__main__":
    main()
