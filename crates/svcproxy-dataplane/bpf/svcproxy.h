// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// What the socket programs (sock.c) include: lib/common.h, maps.h (the maps
// pinned by name, so the socket programs and the packet programs use the same
// maps), sched.h (the schedulers) and service.h (the service lookup); and here
// the layouts of their own maps. Mirrored by src/ebpf/wire.rs; change both
// together.

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

#endif
