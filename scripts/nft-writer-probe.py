#!/usr/bin/env python3
"""Another nftables writer, timed: how long it waits while svcproxy writes.

Every INTERVAL seconds, until DURATION seconds have passed or the file STOP
exists, sends one nf_tables transaction over netlink (creating its own table
`ip svcprobe`, an update of nothing after the first) and times it from send to
the kernel's acknowledgement. A transaction waits while another one holds the
kernel's nftables lock, so the longest time is the longest stall another writer
(a CNI plugin, a firewall) would see. Run it in the namespace svcproxy writes to
(`ip netns exec NS`); it deletes its table at the end.

  nft-writer-probe.py [--interval 0.005] [--duration 600] [--stop FILE]

Prints one line: transactions, median, p99 and max milliseconds, and the second
(from the start) at which the max was seen.
"""
import argparse
import os
import socket
import struct
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWTABLE = 0
NFT_MSG_DELTABLE = 2
NFTA_TABLE_NAME = 1
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_CREATE = 0x400
NLMSG_ERROR = 0x2
AF_UNSPEC = 0
AF_INET = 2
TABLE = b"svcprobe\0"


def msg(kind, flags, seq, family, res_id, payload=b""):
    body = struct.pack("!BBH", family, 0, res_id) + payload
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def attr(kind, data):
    pad = (4 - len(data) % 4) % 4
    return struct.pack("=HH", 4 + len(data), kind) + data + b"\0" * pad


def transaction(sock, seq, table_msg):
    batch = (
        msg(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
        + msg((NFNL_SUBSYS_NFTABLES << 8) | table_msg, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
              seq + 1, AF_INET, 0, attr(NFTA_TABLE_NAME, TABLE))
        + msg(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + 2, AF_UNSPEC, NFNL_SUBSYS_NFTABLES)
    )
    start = time.monotonic()
    sock.send(batch)
    while True:
        data = sock.recv(65536)
        off = 0
        while off + 16 <= len(data):
            length, kind, _, s, _ = struct.unpack_from("=IHHII", data, off)
            if kind == NLMSG_ERROR and s == seq + 1:
                (err,) = struct.unpack_from("=i", data, off + 16)
                if err != 0:
                    raise OSError(-err, os.strerror(-err))
                return time.monotonic() - start
            off += max(length, 16)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--stop", default=None)
    a = p.parse_args()
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    transaction(sock, 1, NFT_MSG_NEWTABLE)  # the table, created untimed
    times = []
    worst_at = 0.0
    began = time.monotonic()
    seq = 4
    try:
        while time.monotonic() - began < a.duration:
            if a.stop and os.path.exists(a.stop):
                break
            took = transaction(sock, seq, NFT_MSG_NEWTABLE)
            seq += 3
            if not times or took > max(times):
                worst_at = time.monotonic() - began
            times.append(took)
            time.sleep(a.interval)
    finally:
        transaction(sock, seq, NFT_MSG_DELTABLE)
    times.sort()
    ms = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e3
    print(f"transactions {len(times)} median_ms {ms(0.5):.2f} p99_ms {ms(0.99):.2f} "
          f"max_ms {times[-1] * 1e3:.2f} max_at_s {worst_at:.1f}")


if __name__ == "__main__":
    main()
