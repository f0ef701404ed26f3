#!/usr/bin/env python3
"""Hostile-client load against a running extender binary (issue 27), loopback only.

Starts the binary on the embedded example cluster (offline mode), runs each attack in turn
with a bounded number of connections for a bounded time, and prints, per attack: how many of
the attacker's connections the server still holds open, the server's RSS (now and peak), and
the latency of a normal filter call made during the attack. Stops by itself.

    scripts/hostile_load.py target/release/device-numa-extender [--label after] [--hold 15]
    scripts/hostile_load.py BINARY --webhook-only   # the webhook listener's attacks alone

Only flags every version has are used, so an older binary gives the "before" figures (the
webhook's own cap, --webhook-max-connections, is set only where `serve --help` lists it). The
webhook listener (issue 36 §2) is attacked over TLS with a certificate made by `openssl`, at a
connection cap of 16 as the defect was reported. The figures go in RELIABILITY.md ("Hostile
clients"). Not a test: nothing here asserts; it measures.
"""

import argparse
import asyncio
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


FILTER_BODY = json.dumps(
    {
        "Pod": {
            "metadata": {"name": "normal", "namespace": "default", "uid": "u-normal"},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                "limits": {"nvidia.com/gpu": "1"}}}
                ]
            },
        },
        "NodeNames": [f"gpu-node-{i}" for i in range(4)],
    }
).encode()


async def request(port, method, path, body=b"", timeout=60.0):
    """One request on a fresh connection; returns (status, seconds) or (error, seconds)."""
    start = time.monotonic()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        head = (f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        w.write(head + body)
        await w.drain()
        line = await asyncio.wait_for(r.readline(), timeout)
        await asyncio.wait_for(r.read(), timeout)
        w.close()
        status = line.split()[1].decode() if line else "closed"
    except Exception as e:  # noqa: BLE001 - a measurement reports any failure
        status = type(e).__name__
    return status, time.monotonic() - start


def client_tls():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


REVIEW_BODY = json.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "u"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
                   "spec": {"containers": [{"name": "c", "resources": {
                       "limits": {"nvidia.com/gpu": "1"}}}]}},
    },
}).encode()


async def review(port, timeout=30.0):
    """One admission review over TLS on a fresh connection: (status, seconds)."""
    start = time.monotonic()
    try:
        r, w = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_tls()), timeout)
        head = (f"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(REVIEW_BODY)}\r\nconnection: close\r\n\r\n").encode()
        w.write(head + REVIEW_BODY)
        await w.drain()
        line = await asyncio.wait_for(r.readline(), timeout)
        await asyncio.wait_for(r.read(), timeout)
        w.close()
        status = line.split()[1].decode() if line else "closed"
    except Exception as e:  # noqa: BLE001 - a measurement reports any failure
        status = type(e).__name__
    return status, time.monotonic() - start


class Attack:
    def __init__(self, n, tls=False):
        self.n = n
        self.tls = tls
        self.conns = []

    async def open(self, port):
        for _ in range(self.n):
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", port, ssl=client_tls() if self.tls else None), 30)
                self.conns.append((r, w))
            except (OSError, asyncio.TimeoutError, ssl.SSLError):
                pass

    def still_open(self):
        """Connections the server has not closed (no EOF or reset seen by the event loop)."""
        return sum(1 for r, w in self.conns
                   if not (r._eof or r.exception() is not None or w.transport.is_closing()))

    def close(self):
        for _, w in self.conns:
            try:
                w.transport.abort()
            except Exception:  # noqa: BLE001
                pass


async def feed(attack, chunk_fn, period, duration):
    """Writes chunk_fn(i) to every connection each `period` seconds for `duration`."""
    end = time.monotonic() + duration
    i = 0
    while time.monotonic() < end:
        for _, w in attack.conns:
            if not w.is_closing():
                try:
                    w.write(chunk_fn(i))
                except Exception:  # noqa: BLE001
                    pass
        i += 1
        await asyncio.sleep(period)


async def run_attack(name, proc, port, attack_port, setup, hold, normal=None):
    before, _ = rss_mb(proc.pid)
    attack = await setup(attack_port)
    task = asyncio.create_task(hold(attack))
    await asyncio.sleep(1.0)
    latencies = []
    for _ in range(5):
        if normal is None:
            status, secs = await request(port, "POST", "/filter", FILTER_BODY, timeout=30)
        else:
            status, secs = await normal()
        latencies.append((status, secs))
    await task
    during, peak = rss_mb(proc.pid)
    held = attack.still_open()
    attack.close()
    await asyncio.sleep(2.0)
    after, _ = rss_mb(proc.pid)
    worst = max(s for _, s in latencies)
    statuses = sorted({st for st, _ in latencies})
    print(f"{name:<28} held {held:>5}/{attack.n:<5} RSS {before:6.0f} -> {during:6.0f} MB "
          f"(peak {peak:6.0f}, after close {after:6.0f})  normal {'review' if normal else 'filter'}: worst {worst:6.2f}s "
          f"statuses {statuses}", flush=True)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--label", default="")
    ap.add_argument("--hold", type=float, default=15.0, help="seconds each attack lasts")
    ap.add_argument("--webhook-only", action="store_true", help="only the webhook's attacks")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    port, probe, webhook = free_port(), free_port(), free_port()
    certs = tempfile.mkdtemp()
    crt, key = os.path.join(certs, "tls.crt"), os.path.join(certs, "tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", key, "-out", crt], check=True, capture_output=True)
    help_text = subprocess.run([args.binary, "serve", "--help"], capture_output=True,
                               text=True).stdout
    cmd = [args.binary, "serve", "--cluster-file", os.path.join(ROOT, "examples/cluster.yaml"),
           "--listen", f"127.0.0.1:{port}", "--probe-address", f"127.0.0.1:{probe}",
           "--log-level", "error",
           "--webhook-listen", f"127.0.0.1:{webhook}", "--webhook-tls-cert-file", crt,
           "--webhook-tls-key-file", key]
    if args.webhook_only:
        # The cap the defect was reported at: the webhook shared --max-connections before it
        # had a cap of its own.
        cmd += ["--max-connections", "16"]
        if "--webhook-max-connections" in help_text:
            cmd += ["--webhook-max-connections", "16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            st, _ = await request(probe, "GET", "/readyz", timeout=5)
            if st == "200":
                break
            await asyncio.sleep(0.1)
        print(f"# {args.label} {args.binary} (hold {args.hold:.0f}s per attack)")
        baseline = [await request(port, "POST", "/filter", FILTER_BODY) for _ in range(5)]
        print(f"{'no attack':<28} normal filter: worst {max(s for _, s in baseline):6.3f}s "
              f"statuses {sorted({st for st, _ in baseline})}; RSS {rss_mb(proc.pid)[0]:.0f} MB")
        hold = args.hold
        if args.webhook_only:
            await webhook_attacks(proc, webhook, hold)
            return

        # 1. Header flood on the probe port: ~390 KB of headers each, never finished.
        async def flood_setup(p):
            a = Attack(600)
            await a.open(p)
            line = b"x-flood: " + b"a" * 8000 + b"\r\n"
            for _, w in a.conns:
                w.write(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + line * 48)
            return a

        async def just_hold(a):
            await asyncio.sleep(hold)

        await run_attack("probe header flood (600)", proc, port, probe, flood_setup, just_hold)

        # 2. Slowloris on the verb port: one header byte a second.
        async def loris_setup(p):
            a = Attack(200)
            await a.open(p)
            for _, w in a.conns:
                w.write(b"POST /filter HTTP/1.1\r\n")
            return a

        await run_attack("verb slowloris (200)", proc, port, port, loris_setup,
                         lambda a: feed(a, lambda i: b"x", 1.0, hold))

        # 3. Idle keep-alive flood: one request each, then silence.
        async def idle_setup(p):
            a = Attack(4000)
            await a.open(p)
            for _, w in a.conns:
                w.write(b"GET /debug/nodes/gpu-node-0 HTTP/1.1\r\nhost: x\r\n\r\n")
            return a

        await run_attack("verb idle flood (4000)", proc, port, port, idle_setup, just_hold)

        # 4. Slow bodies: headers, then one body byte a second.
        async def slow_body_setup(p):
            a = Attack(300)
            await a.open(p)
            for _, w in a.conns:
                w.write(b"POST /filter HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        b"content-length: 100000\r\n\r\n")
            return a

        await run_attack("verb slow bodies (300)", proc, port, port, slow_body_setup,
                         lambda a: feed(a, lambda i: b" ", 1.0, hold))

        # 5. Big bodies: 40 valid filter requests of ~15 MiB each (a GPU pod and ~650,000 node
        # names none of which exists), sent whole at once: read, decoded and answered (every
        # name is a failed node in the answer), the worst a body does inside the limits.
        names = [f"no-such-node-{i:07d}" for i in range(650_000)]
        big = json.loads(FILTER_BODY)
        big["NodeNames"] = names
        big_body = json.dumps(big).encode()

        async def big_setup(p):
            a = Attack(40)
            await a.open(p)
            for _, w in a.conns:
                w.write(b"POST /filter HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(big_body)}\r\n\r\n".encode() + big_body)
            return a

        await run_attack("verb big bodies (40x15MiB)", proc, port, port, big_setup, just_hold)

        # 6. A declared length of 10^9 and no body: how long until the answer.
        start = time.monotonic()
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /filter HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 1000000000\r\n\r\n")
        try:
            line = await asyncio.wait_for(r.readline(), 60)
        except asyncio.TimeoutError:
            line = b"no answer in 60 s"
        print(f"{'declared 10^9 bytes':<28} answer {line.strip().decode(errors='replace')!r} "
              f"after {time.monotonic() - start:.2f}s", flush=True)
        w.transport.abort()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def webhook_attacks(proc, port, hold):
    """The webhook listener (issue 36 §2), over TLS, at a connection cap of 16."""
    base = [await review(port) for _ in range(5)]
    print(f"{'webhook, no attack':<28} normal review: worst {max(s for _, s in base):6.3f}s "
          f"statuses {sorted({st for st, _ in base})}; RSS {rss_mb(proc.pid)[0]:.0f} MB",
          flush=True)

    async def just_hold(a):
        await asyncio.sleep(hold)

    # W1. Slow bodies: 16 connections (the cap), a review head each, then a body byte a second.
    async def slow_setup(p):
        a = Attack(16, tls=True)
        await a.open(p)
        for _, w in a.conns:
            w.write(b"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 100000\r\n\r\n{")
        return a

    await run_attack("webhook slow bodies (16)", proc, port, port, slow_setup,
                     lambda a: feed(a, lambda i: b" ", 1.0, hold), normal=lambda: review(port))

    # W2. Unfinished large bodies: 55 connections declaring 16 MiB and sending 15 MiB of it.
    chunk = b" " * (1 << 20)

    async def big_setup(p):
        a = Attack(55, tls=True)
        await a.open(p)
        for _, w in a.conns:
            w.write(b"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    + f"content-length: {16 << 20}\r\n\r\n".encode())
        for _ in range(15):
            for _, w in a.conns:
                if not w.is_closing():
                    w.write(chunk)
            await asyncio.sleep(0.2)
        return a

    await run_attack("webhook 55 x 15 MiB unfinished", proc, port, port, big_setup, just_hold,
                     normal=lambda: review(port))

    # W3. The same within the body limit: 55 connections, 3 MiB declared, 2.9 MiB sent.
    async def limit_setup(p):
        a = Attack(55, tls=True)
        await a.open(p)
        for _, w in a.conns:
            w.write(b"POST /mutate-pods HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    + f"content-length: {3 << 20}\r\n\r\n".encode())
            w.write(b" " * ((3 << 20) - (100 << 10)))
        return a

    await run_attack("webhook 55 x 2.9 MiB unfinished", proc, port, port, limit_setup, just_hold,
                     normal=lambda: review(port))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
