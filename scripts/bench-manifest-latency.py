#!/usr/bin/env python3
"""Write of a manifest -> the daemon's sync, at scale (issue 16's "write of the
manifest -> rules in the kernel").

Generates a cluster as manifest files with svcproxy-fakeapi (default 10000 Services x
10 endpoints, 50 Nodes), runs the daemon on that directory (nftables mode,
`--min-sync-period 0`) in a network namespace this script creates and deletes, and
after the first sync adds a new Service and its EndpointSlice (two files renamed into
the directory at once) several times. For each it prints the time from the rename to
the first sync logged after it, once the new cluster IP is in the kernel's table.

Usage: scripts/bench-manifest-latency.py [--services N] [--probes K]
Needs root, ip and nft, and release builds (cargo build --release -p svcproxy
-p svcproxy-fakeapi). Traffic: none; only files and the namespace's own tables.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--probes", type=int, default=7)
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(repo, "target"))
    svcproxy = os.path.join(target, "release", "svcproxy")
    fakeapi = os.path.join(target, "release", "svcproxy-fakeapi")
    for b in (svcproxy, fakeapi):
        if not os.access(b, os.X_OK):
            raise SystemExit(f"missing {b}: cargo build --release -p svcproxy -p svcproxy-fakeapi")
    root = tempfile.mkdtemp(prefix="svcproxy-mflat.")
    ns = f"svp-mflat-{os.getpid()}"
    manifests = os.path.join(root, "d")
    os.makedirs(manifests)
    daemon = None
    try:
        api = subprocess.Popen(
            [fakeapi, "--services", str(args.services), "--endpoints-per-service", "10",
             "--nodes", "50", "--manifests-out", manifests,
             "--kubeconfig-out", os.path.join(root, "kubeconfig")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in api.stdout:
            if line.strip() == "ready":
                break
        api.kill()
        api.wait()
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        log_path = os.path.join(root, "svcproxy.err")
        with open(log_path, "w") as log:
            daemon = subprocess.Popen(
                ["ip", "netns", "exec", ns, svcproxy, "--proxy-mode", "nftables",
                 "--manifests", manifests,
                 "--hostname-override", "node-1", "--min-sync-period", "0",
                 "--healthz-bind-address", "127.0.0.1:10256"],
                stdout=subprocess.DEVNULL, stderr=log)

        def synced():
            with open(log_path, errors="replace") as f:
                return [ANSI.sub("", l) for l in f if "svcproxy::proxy" in l and " synced " in l]

        start = time.time()
        while not synced():
            if time.time() - start > 300 or daemon.poll() is not None:
                raise SystemExit("no first sync")
            time.sleep(0.2)
        print(f"first sync {time.time() - start:.1f} s after start", flush=True)
        time.sleep(3)
        # A plain ClusterIP Service and its slice, copied from a generated pair.
        svc = json.load(open(os.path.join(manifests, "service-ns-0-svc-0.json")))
        slc = json.load(open(glob.glob(os.path.join(manifests, "endpointslice-ns-0-svc-0-*.json"))[0]))
        for k in ("type", "nodePort", "externalTrafficPolicy", "healthCheckNodePort",
                  "loadBalancerSourceRanges", "externalIPs"):
            svc["spec"].pop(k, None)
        for p in svc["spec"]["ports"]:
            p.pop("nodePort", None)
        svc.pop("status", None)
        times = []
        for k in range(args.probes):
            name, vip = f"probe-{k}", f"10.96.250.{k + 1}"
            s = json.loads(json.dumps(svc))
            s["metadata"]["name"] = name
            s["metadata"].pop("uid", None)
            s["spec"]["clusterIP"], s["spec"]["clusterIPs"] = vip, [vip]
            e = json.loads(json.dumps(slc))
            e["metadata"]["name"] = f"{name}-abcde"
            e["metadata"].pop("uid", None)
            e["metadata"]["labels"]["kubernetes.io/service-name"] = name
            for i, ep in enumerate(e["endpoints"]):
                ep["addresses"] = [f"10.250.{k}.{i + 1}"]
            files = [(s, f"service-ns-0-{name}.json"), (e, f"endpointslice-ns-0-{name}-abcde.json")]
            for obj, fn in files:
                with open(os.path.join(root, fn), "w") as f:
                    json.dump(obj, f)
            before = len(synced())
            written = time.time()
            for _, fn in files:
                os.rename(os.path.join(root, fn), os.path.join(manifests, fn))
            while time.time() - written < 10:
                if len(synced()) > before:
                    table = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", "ip", "svcproxy"],
                                           capture_output=True, text=True).stdout
                    if vip in table:
                        break
                time.sleep(0.005)
            else:
                raise SystemExit(f"{name}: not in the kernel after 10 s")
            first = synced()[before].split()[0]
            done = datetime.datetime.fromisoformat(first.replace("Z", "+00:00")).timestamp()
            times.append((done - written) * 1000)
            print(f"{name}: {times[-1]:.0f} ms from the write to the sync", flush=True)
            time.sleep(1.5)
        times.sort()
        print(f"{args.services} services: median {times[len(times) // 2]:.0f} ms, "
              f"min {times[0]:.0f} ms, max {times[-1]:.0f} ms")
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
        subprocess.run(["ip", "netns", "delete", ns], stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
