// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// What svcproxy's programs share, by concern in lib/: common.h, maps.h (the
// maps pinned by name, so the socket programs of sock.c and the packet programs
// of tc.c use the same maps), sched.h (the schedulers) and service.h (the
// service lookup); and here the layouts of the socket programs' and the packet
// path's own maps. Mirrored by src/ebpf/wire.rs; change both together.

#ifndef SVCPROXY_H
#define SVCPROXY_H

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/sched.h"
#include "lib/service.h"

#define ECONNREFUSED 111
#define ETIMEDOUT 110

// A socket's translated peer: the endpoint it was sent to, by socket cookie.
struct rev_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct rev_val {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

// A connected socket's service address and endpoint, in the socket's own
// storage (freed with it, never evicted).
struct sock_peer {
	__u32 vip[4];
	__u16 vport;
	__u8 family; // the endpoint's (FAMILY_*)
	__u8 counted; // the connection counts in svcproxy_conns until released
	__u32 be[4];
	__u16 beport;
	__u16 pad2;
};

// An unconnected UDP socket's flow to one service address, so its datagrams
// stay with one endpoint as conntrack keeps a flow.
struct flow_key {
	__u64 cookie;
	struct svc_key svc;
};

// A packet-path connection, each way: dir 0 is the client's packets to the
// service address (the value: the endpoint), dir 1 the endpoint's replies to the
// client (the value: the service address to show as their source). dir 2 (UDP):
// the replies a masqueraded flow expects, addressed to the port the kernel's
// masquerade chose (the value: only when, created_ns; the kernel turns them
// back itself).
#define CT_ORIGINAL 0
#define CT_REPLY 1
#define CT_MASQUERADED_REPLY 2
// A connection the XDP program masqueraded itself (tc.c: snat_alloc), each
// way: dir 3 its packets once sent to the endpoint (client to endpoint; the
// value: the node's address and port they leave from), dir 4 the endpoint's
// replies to that address and port (the value: the client).
#define CT_SNAT 3
#define CT_SNAT_REPLY 4

struct ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 dir; // CT_*
	__u8 pad;
};

struct ct_val {
	__u32 addr[4];
	__u16 port;
	__u8 flags; // ROUTE_MASQUERADE, CT_CLOSING, CT_BPF_SNAT
	__u8 counted; // CT_ORIGINAL: the connection counts in svcproxy_conns
	__u32 seen_s; // CT_ORIGINAL: when a packet of it last passed, in seconds
	__u64 created_ns; // when the connection's endpoint was chosen
};

// ct_val.flags: a FIN or RST of the connection passed.
#define CT_CLOSING 0x80
// CT_ORIGINAL's: the masquerade is svcproxy's own (its CT_SNAT entries), not
// the kernel's conntrack's.
#define CT_BPF_SNAT 0x02
// CT_SNAT_REPLY's: a reply of the connection came (until then its port is held
// as briefly as conntrack holds an unanswered connection).
#define CT_REPLIED 0x04
// CT_REPLY's: the connection's first packet was sent on from XDP (the kernel's
// conntrack never saw it): its replies are kept from the conntrack too.
#define CT_XDP 0x08
// decide()'s answer only, never stored: the packet's connection is new (its
// endpoint chosen for this packet).
#define CT_FRESH 0x40

// The packet path's idle timeouts, in seconds (0: none; the LRU alone forgets):
// kube-proxy's --ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout.
struct timeouts {
	__u32 tcp;
	__u32 tcpfin;
	__u32 udp;
	__u32 pad;
};

struct aff_ip_key {
	__u64 affinity_id;
	__u32 client[4]; // the client's address
};

#endif
