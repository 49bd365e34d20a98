// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The XDP program's maps (xdp.c) and their layouts: the interfaces it may send
// frames to (svcproxy_xdp_tx), its counts (svcproxy_xdp_stats) and its cache
// (svcproxy_xdp_nat). tc.c includes this header too, though its programs use
// none of them: tc.o declares every map of the packet path, as it always has,
// so that loading it creates and pins them all with the XDP path off as well
// (svcproxy writes svcproxy_xdp_tx and reads svcproxy_xdp_stats either way).

#ifndef SVCPROXY_LIB_XDP_MAPS_H
#define SVCPROXY_LIB_XDP_MAPS_H

#include "ct.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} svcproxy_xdp_tx SEC(".maps"); // interface index -> its MTU

// Packets the XDP program sent on (XDP_STAT_FORWARD), dropped, and left to the
// stack, per CPU.
#define XDP_STAT_FORWARD 0
#define XDP_STAT_DROP 1
#define XDP_STAT_PASS 2
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 3);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u64);
} svcproxy_xdp_stats SEC(".maps");

// How a connection's packets leave from XDP: its endpoint, the interface to
// it, the Ethernet addresses, the checksums' change; and when that was found out (the maps'
// generation, and jiffies).
struct xdp_fwd {
	__u32 addr[4];
	__u16 port;
	// The source it leaves with: the client's, or the node's address and port
	// svcproxy masqueraded it to.
	__u16 sport;
	__u32 saddr[4];
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	// What the translation adds to the IPv4 header's checksum, and to the
	// TCP or UDP one (the same for every packet of the connection).
	__u16 l3_delta;
	__u16 l4_delta;
	__u8 pad[2];
	__u32 ifindex;
	// The interface's MTU: a longer packet takes the stack's way (which fragments
	// it, or says so to its sender).
	__u32 mtu;
	__u32 generation;
	__u64 jiffies;
};

// The XDP program's cache: for each connection it sent on, how. A packet of it
// (no SYN, FIN or RST) finds there all it needs, with no other lookup, while
// the maps are unchanged since (svcproxy bumps their generation after each
// write) and for at most FWD_FRESH_JIFFIES (a second at the common HZ=250):
// then the whole decision is made again, and the connection touched, its
// route and neighbour looked up afresh. A connection forgotten here is only
// slower.
#define FWD_FRESH_JIFFIES 250

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct ct_key);
	__type(value, struct xdp_fwd);
} svcproxy_xdp_nat SEC(".maps");

#endif
