// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// svcproxy's own masquerade, for the connections the XDP program sends on
// (the kernel's conntrack masquerades the rest, and never sees these): the
// node's address toward the endpoint (the kernel's FIB says which, as the
// masquerade would choose) and a port of svcproxy_snat's range, which lies
// above the node's ip_local_port_range and outside the kernel masquerade's
// (the fixed rule's `to :1024-<lo - 1>`), so neither the node's sockets nor
// the kernel ever use it. Each translation is remembered both ways in svcproxy_ct
// (CT_SNAT, CT_SNAT_REPLY); a packet of the connection that meets the tc
// program instead is marked with both marks, and the egress program, after
// routing, gives it the same source. The endpoint's replies are turned back to
// the client by the ingress program of whichever interface they arrive on.
//
// Here is what both programs use: the maps, the source a connection leaves
// with (snat_out), a masquerade lost (snat_lost), the marks (mark_snat). The XDP
// program alone takes a port to masquerade (snat_alloc, in xdp.c); the tc
// programs' own steps (snat_reply, snat_known, snat_egress) are in tc.c. The
// range serves one more purpose there: a client port remapped where two
// connections would be one tuple at their endpoint (tc.c: remap_new; its reply
// entries are keyed by the client's own address, never the node's, so the two
// uses never meet).

#ifndef SVCPROXY_LIB_NAT_H
#define SVCPROXY_LIB_NAT_H

#include "ct.h"
#include "pkt.h"

// svcproxy_snat's value: the ports (host order), hi 0 when svcproxy masquerades
// nothing itself (no room above ip_local_port_range); and whether the XDP
// program runs (SNAT_XDP).
struct snat_range {
	__u16 lo;
	__u16 hi;
	__u32 flags;
};
#define SNAT_XDP 1

// Ports svcproxy's masquerade took for new connections, and the new connections
// that found none free (left to the kernel's masquerade), per CPU.
#define SNAT_STAT_TAKEN 0
#define SNAT_STAT_EXHAUSTED 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u64);
} svcproxy_snat_stats SEC(".maps");

static __always_inline void snat_count(__u32 stat)
{
	count_in(&svcproxy_snat_stats, stat);
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct snat_range);
} svcproxy_snat SEC(".maps");

// The source the connection `fk` (CT_SNAT's key) leaves with, into `out`; its
// reply entry touched (a one-way flow keeps its port) and told of a FIN or RST
// (`closing`). 0 when it has none: forgotten, or its port since given to
// another connection (this one was idle past its time).
static __noinline int snat_out(const struct ct_key *fk, int closing, struct ct_val *out)
{
	struct ct_val *e = bpf_map_lookup_elem(&svcproxy_ct, fk);
	if (!e)
		return 0;
	*out = *e;
	struct ct_key rk;
	ct_key_make(&rk, fk->daddr, out->addr, fk->dport, out->port, fk->proto,
		    fk->family, CT_SNAT_REPLY);
	struct ct_val *back = bpf_map_lookup_elem(&svcproxy_ct, &rk);
	if (!back || back->port != fk->sport || !addr_eq(back->addr, fk->saddr))
		return 0;
	touch(back);
	if (closing)
		back->flags |= CT_CLOSING;
	return 1;
}

// Both marks: a packet of a connection svcproxy masquerades itself, or a
// reply (or an ICMP error) of a connection the XDP program sent on. The fixed
// rules leave it alone but for one, in raw prerouting: the kernel's conntrack
// does not track it (its connection's other way, sent on from XDP, is never
// seen: tracked, a reply would be a new flow for the node's other NAT rules, a
// CNI's masquerade of pods' traffic to outside among them).
static __always_inline void mark_snat(struct __sk_buff *skb)
{
	struct config *cfg = config();
	if (cfg)
		skb->mark |= cfg->masquerade_mark | cfg->reject_mark;
}

// A connection svcproxy masqueraded whose masquerade is gone (the LRU forgot
// it, or its port went to another connection after it idled past its time):
// forgotten whole, so that its next packet meets no connection here (a UDP
// flow starts again, a TCP segment meets the node's reset).
static __always_inline void snat_lost(const struct ct_key *orig, __u8 family)
{
	struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, orig);
	if (ct)
		release_flow(ct, family);
	bpf_map_delete_elem(&svcproxy_ct, orig);
}

#endif
