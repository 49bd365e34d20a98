#!/usr/bin/env python3
"""Writes a manifests directory for the scale benchmarks: SERVICES ClusterIP
Services (10.96.0.0/16, up to 65,536; beyond, 10.97... and on) with ENDPOINTS
ready endpoints each (one EndpointSlice per Service), 100 Services to a file, and
10 Nodes (node-0 .. node-9, three zones), as block-style YAML.

    scripts/gen-cluster.py DIR SERVICES [ENDPOINTS] [AFFINITY_EVERY]

ENDPOINTS defaults to 10. With AFFINITY_EVERY = K > 0, one Service in K (those
with i % K == 7 % K, as fakeapi's mix at K = 50, i.e. 2%) has ClientIP session
affinity with upstream's default timeout.
"""
import sys
d, n = sys.argv[1], int(sys.argv[2])
eps_per = int(sys.argv[3]) if len(sys.argv) > 3 else 10
aff_every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
per = 100
def service(i):
    a, b = (i >> 8) & 255, i & 255
    net = 96 + (i >> 16)
    return f"""apiVersion: v1
kind: Service
metadata:
  name: svc-{i}
  namespace: bench
  labels:
    app: svc-{i}
spec:
  type: ClusterIP
  clusterIP: 10.{net}.{a}.{b}
  clusterIPs:
  - 10.{net}.{a}.{b}
  ipFamilies:
  - IPv4
  selector:
    app: svc-{i}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
""" + (AFFINITY if aff_every and i % aff_every == 7 % aff_every else "")
AFFINITY = """  sessionAffinity: ClientIP
  sessionAffinityConfig:
    clientIP:
      timeoutSeconds: 10800
"""
def endpoint(i, e):
    return f"""- addresses:
  - 10.{100 + i % 100}.{(i // 100) % 256}.{e % 250 + 1}
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-{e % 10}
  zone: zone-{e % 3}
"""
def slice_(i):
    eps = "".join(endpoint(i, e) for e in range(eps_per))
    return f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-{i}-abcde
  namespace: bench
  labels:
    kubernetes.io/service-name: svc-{i}
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
{eps}"""
for f in range((n + per - 1) // per):
    docs = []
    for i in range(f * per, min(n, (f + 1) * per)):
        docs += [service(i), slice_(i)]
    open(f"{d}/svc-{f:04d}.yaml", "w").write("---\n".join(docs))
nodes = [f"""apiVersion: v1
kind: Node
metadata:
  name: node-{e}
  labels:
    topology.kubernetes.io/zone: zone-{e % 3}
""" for e in range(10)]
open(f"{d}/nodes.yaml", "w").write("---\n".join(nodes))
