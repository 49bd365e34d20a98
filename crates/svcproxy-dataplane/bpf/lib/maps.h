// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The maps that the socket programs (sock.c) and the packet programs share,
// and their layouts: pinned by name, so that every object uses the same maps.
// The schedulers' maps are in sched.h. Mirrored by src/ebpf/wire.rs; change
// both together.

#ifndef SVCPROXY_LIB_MAPS_H
#define SVCPROXY_LIB_MAPS_H

#include "common.h"

// A route's action (wire.rs: Action).
#define ACT_FORWARD 0
#define ACT_DROP 1
#define ACT_REJECT 2
#define ACT_PASS 3

// A route's flags. A host socket's route (a socket bound to a source
// address): masquerade it, or masquerade it unless that source is among the
// pods' (svcproxy_podnet), as the packet modes masquerade the node's packets.
#define ROUTE_MASQUERADE 1
#define ROUTE_MASQUERADE_UNLESS_POD 2

// A service address: a VIP (cluster, external or load-balancer IP), a node
// address with a NodePort, or (addr all zero) a NodePort on every local address.
struct svc_key {
	__u32 addr[4];
	__u16 port; // network order
	__u8 proto; // IPPROTO_*
	__u8 family;
};

// What a connection from one origin meets.
struct route {
	__u32 list;  // endpoint list id (slots and members maps)
	__u32 count; // endpoints in the list
	__u8 action;
	__u8 flags; // ROUTE_*
	__u8 sched; // SCHED_*
	__u8 mh_size; // SCHED_MH: the table's size, as an index of mh_cells()
};

struct svc_val {
	struct route pod;  // a socket of a process in any other network namespace
	struct route host; // a socket of a process in the host's network namespace
	struct route pkt_pod;   // a packet from one of this node's pods
	struct route pkt_other; // a packet from anywhere else
	__u64 affinity_id; // the service port, for its affinity entries
	__u64 fw_id; // non-zero: svcproxy_fw must admit a packet's source
	__u32 affinity_secs; // 0: no session affinity
	__u32 pad;
};

struct slot_key {
	__u32 list;
	__u32 slot;
};

struct backend {
	__u32 addr[4];
	__u16 port; // network order
	__u8 family;
	__u8 pad; // a slot of a weighted list: the endpoint's weight (else 0)
};

struct member_key {
	__u32 list;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct local_key {
	__u32 addr[4];
	__u8 family;
	__u8 pad[3];
};

struct aff_key {
	__u64 affinity_id;
	__u64 client; // the client's network namespace cookie
};

struct aff_val {
	struct backend be;
	__u64 last_ns;
};

struct config {
	__u64 host_netns_cookie;
	// Translate only the host's own sockets (pods' connections then meet the
	// packet path), as Cilium's socketLB.hostNamespaceOnly.
	__u32 host_only;
	// Marks the packet programs set: masquerade this connection (the intent's
	// mark, kube-proxy's 0x4000 by default), reject this packet. Each acted on
	// by one fixed nftables rule.
	__u32 masquerade_mark;
	__u32 reject_mark;
	// Successful writes of the maps by svcproxy so far (0: none yet); the
	// programs do not read it.
	__u32 generation;
};

// loadBalancerSourceRanges: a fenced service port's id and an admitted prefix
// (prefixlen counts the id's 64 bits too).
struct fw_key {
	__u32 prefixlen;
	__u32 id[2];
	__u32 addr[4];
};

// This node's pods' sources (--detect-local-mode ClusterCIDR / NodeCIDR);
// prefixlen counts the family word's 32 bits too.
struct podnet_key {
	__u32 prefixlen;
	__u32 family;
	__u32 addr[4];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} svcproxy_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2097152);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct slot_key);
	__type(value, struct backend);
} svcproxy_slot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct member_key);
	__type(value, __u8);
} svcproxy_member SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct local_key);
	__type(value, __u8);
} svcproxy_local SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
} svcproxy_aff SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct config);
} svcproxy_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct fw_key);
	__type(value, __u8);
} svcproxy_fw SEC(".maps");

// The service address space's guard: every cluster IP (key as svcproxy_local's)...
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct local_key);
	__type(value, __u8);
} svcproxy_vip SEC(".maps");

// ... and the ServiceCIDRs (key as svcproxy_podnet's).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct podnet_key);
	__type(value, __u8);
} svcproxy_guard SEC(".maps");

// This node's pods' CIDRs (--detect-local-mode ClusterCIDR / NodeCIDR): the
// packet path's detector, and a bound host socket's (sock.c).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct podnet_key);
	__type(value, __u8);
} svcproxy_podnet SEC(".maps");

// `addr` (of `family`) is among this node's pods' CIDRs.
static __always_inline int pod_source(__u8 family, const __u32 *addr)
{
	struct podnet_key k = {};
	k.prefixlen = 32 + (family == FAMILY_V4 ? 32 : 128);
	k.family = family;
	addr_copy(k.addr, addr);
	return bpf_map_lookup_elem(&svcproxy_podnet, &k) != 0;
}

static __always_inline struct config *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&svcproxy_cfg, &zero);
}

#endif
