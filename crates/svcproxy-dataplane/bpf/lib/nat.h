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
	__u64 *n = bpf_map_lookup_elem(&svcproxy_snat_stats, &stat);
	if (n)
		*n += 1;
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct snat_range);
} svcproxy_snat SEC(".maps");

// How long a port stays a connection's after its last packet either way: the
// kernel conntrack's timeouts (a TCP connection's five days once answered, two
// minutes before (SYN_SENT) and once closed (TIME_WAIT); a UDP flow's two
// minutes once answered, 30 s before), or --ipvs-tcp-timeout and
// --ipvs-udp-timeout when given, for answered connections.
#define SNAT_TCP_S (5U * 24 * 3600)
#define SNAT_CLOSED_S 120
#define SNAT_UNANSWERED_TCP_S 120
#define SNAT_UDP_S 120
#define SNAT_UNANSWERED_UDP_S 30
// Ports tried at random for a new connection before it is left to the
// kernel's masquerade.
#define SNAT_TRIES 16

// Whether a reply entry whose flags and last packet (seen_s) are these has
// outlived its connection.
static __always_inline int snat_reusable(__u8 flags, __u32 seen_s, int tcp)
{
	__u32 zero = 0;
	struct timeouts *t = bpf_map_lookup_elem(&svcproxy_timeouts, &zero);
	__u32 limit;
	if (!(flags & CT_REPLIED))
		limit = tcp ? SNAT_UNANSWERED_TCP_S : SNAT_UNANSWERED_UDP_S;
	else if (!tcp)
		limit = t && t->udp ? t->udp : SNAT_UDP_S;
	else if (flags & CT_CLOSING)
		limit = SNAT_CLOSED_S;
	else
		limit = t && t->tcp ? t->tcp : SNAT_TCP_S;
	return now_s() - seen_s > limit;
}

struct snat_try {
	struct ct_key rk; // endpoint -> the node's address, the port tried
	struct ct_val v;  // the client
	__u16 lo;
	__u16 span;
	__u16 port; // network order; 0 while none is found
	__u8 tcp;
	__u8 pad;
};

// A reply entry's port, flags, counted and seen_s, as one 64-bit word (ct_val's
// bytes 16-23, little-endian): what a takeover compares and swaps.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "CT_WORD is little-endian");
#define CT_WORD(port, flags, seen_s) \
	((__u64)(port) | ((__u64)(flags) << 16) | ((__u64)(seen_s) << 32))

// One port tried: free, or its connection long over (the compare-and-swap of
// the word that says so, last packet included, lets only one CPU take it).
static long snat_step(__u32 i, void *data)
{
	struct snat_try *t = data;
	if (!t->span)
		return 1;
	__u16 port = bpf_htons(t->lo + bpf_get_prandom_u32() % t->span);
	t->rk.dport = port;
	if (!bpf_map_update_elem(&svcproxy_ct, &t->rk, &t->v, BPF_NOEXIST)) {
		t->port = port;
		return 1;
	}
	struct ct_val *e = bpf_map_lookup_elem(&svcproxy_ct, &t->rk);
	if (!e)
		return 0;
	__u64 *word = (__u64 *)&e->port;
	__u64 was = *word;
	if (!snat_reusable((__u8)(was >> 16), (__u32)(was >> 32), t->tcp))
		return 0;
	__u64 mine = CT_WORD(t->v.port, 0, t->v.seen_s);
	if (__sync_val_compare_and_swap(word, was, mine) != was)
		return 0;
	addr_copy(e->addr, t->v.addr);
	e->created_ns = t->v.created_ns;
	t->port = port;
	return 1;
}

// A port for the new connection `fk` (CT_SNAT's key: client to endpoint) from
// the node's address `src`, both ways remembered; `out` the source it leaves
// with. 0 when svcproxy masquerades nothing itself or no port was free.
static __noinline int snat_alloc(const struct ct_key *fk, const __u32 *src, struct ct_val *out)
{
	__u32 zero = 0;
	struct snat_range *r = bpf_map_lookup_elem(&svcproxy_snat, &zero);
	if (!r || !r->hi || r->hi < r->lo)
		return 0;
	struct snat_try t;
	__builtin_memset(&t, 0, sizeof(t));
	addr_copy(t.rk.saddr, fk->daddr);
	addr_copy(t.rk.daddr, src);
	t.rk.sport = fk->dport;
	t.rk.proto = fk->proto;
	t.rk.family = fk->family;
	t.rk.dir = CT_SNAT_REPLY;
	addr_copy(t.v.addr, fk->saddr);
	t.v.port = fk->sport;
	t.v.created_ns = bpf_ktime_get_ns();
	t.v.seen_s = t.v.created_ns / 1000000000ULL;
	t.lo = r->lo;
	t.span = r->hi - r->lo + 1;
	t.tcp = fk->proto == IPPROTO_TCP;
	bpf_loop(SNAT_TRIES, snat_step, &t, 0);
	if (!t.port) {
		snat_count(SNAT_STAT_EXHAUSTED);
		return 0;
	}
	__builtin_memset(out, 0, sizeof(*out));
	addr_copy(out->addr, src);
	out->port = t.port;
	out->created_ns = t.v.created_ns;
	out->seen_s = t.v.seen_s;
	if (bpf_map_update_elem(&svcproxy_ct, fk, out, BPF_ANY) == 0) {
		snat_count(SNAT_STAT_TAKEN);
		return 1;
	}
	t.rk.dport = t.port;
	bpf_map_delete_elem(&svcproxy_ct, &t.rk);
	return 0;
}

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

// snat_reply's answer for a packet that is no such reply (TC_ACT_UNSPEC is -1).
#define NOT_SNAT_REPLY -2

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

// An endpoint's reply to a connection svcproxy masqueraded: addressed to the
// client again, marked (the egress program then shows the service address as
// its source, as for any reply). NOT_SNAT_REPLY when the packet is no such
// reply.
static __noinline int snat_reply(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 zero = 0;
	struct snat_range *r = bpf_map_lookup_elem(&svcproxy_snat, &zero);
	__u16 port = bpf_ntohs(p->dport);
	if (!r || !r->hi || port < r->lo || port > r->hi)
		return NOT_SNAT_REPLY;
	struct ct_key k;
	ct_key_of(&k, p);
	k.dir = CT_SNAT_REPLY;
	struct ct_val *e = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!e)
		return NOT_SNAT_REPLY;
	struct ct_val to = *e;
	touch(e);
	__u8 flags = CT_REPLIED;
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		flags |= CT_CLOSING;
	if ((e->flags & flags) != flags)
		e->flags |= flags;
	if (!rewrite(skb, p, 1, to.addr, to.port))
		return TC_ACT_SHOT;
	mark_snat(skb);
	return TC_ACT_UNSPEC;
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

// Whether the connection svcproxy masqueraded that `p` (before translation to
// `flow`'s endpoint) is of still has its masquerade (snat_out); forgotten when
// not.
static __noinline int snat_known(const struct pkt *p, const struct ct_val *flow)
{
	struct ct_key k;
	ct_key_make(&k, p->saddr, flow->addr, p->sport, flow->port, p->proto, p->family, CT_SNAT);
	struct ct_val nat;
	if (snat_out(&k, 0, &nat))
		return 1;
	ct_key_of(&k, p);
	snat_lost(&k, p->family);
	return 0;
}

// A packet of a connection svcproxy masqueraded that met the tc program on
// its way to the endpoint (both marks set at ingress): after routing, the
// source it leaves with. Dropped when the connection has none any more;
// NOT_SNAT_REPLY (sic: no such connection this way) when the packet is no
// packet to an endpoint of such a connection (a reply, marked as well).
static __noinline int snat_egress(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key fk;
	ct_key_of(&fk, p);
	fk.dir = CT_SNAT;
	if (!bpf_map_lookup_elem(&svcproxy_ct, &fk))
		return NOT_SNAT_REPLY;
	struct ct_val nat;
	int closing = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST));
	if (!snat_out(&fk, closing, &nat) || !rewrite(skb, p, 0, nat.addr, nat.port))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

#endif
