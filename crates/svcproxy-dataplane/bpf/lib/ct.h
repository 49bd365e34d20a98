// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The packet path's connection table (svcproxy_ct): its keys and values, one
// entry each way of a connection (CT_*), a key from its parts or a packet
// (ct_key_make, ct_key_of), the idle timeouts (svcproxy_timeouts: idle_expired,
// touch), the end of a connection the lc scheduler counted (release_flow), the
// replies a UDP flow that the kernel masqueraded expects
// (expect_masqueraded_reply, masqueraded_reply), and the client ports remapped
// where two connections would meet as one at their endpoint (svcproxy_remap).

#ifndef SVCPROXY_LIB_CT_H
#define SVCPROXY_LIB_CT_H

#include "pkt.h"
#include "sched.h"

// A packet-path connection, each way: dir 0 is the client's packets to the
// service address (the value: the endpoint), dir 1 the endpoint's replies to the
// client (the value: the service address to show as their source). dir 2 (UDP):
// the replies a masqueraded flow expects, addressed to the port the kernel's
// masquerade chose (the value: only when, created_ns; the kernel turns them
// back itself).
#define CT_ORIGINAL 0
#define CT_REPLY 1
#define CT_MASQUERADED_REPLY 2
// A connection the XDP program masqueraded itself (xdp.c: snat_alloc), each
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
// CT_ORIGINAL's and CT_REPLY's: the connection's client port is remapped on
// its way to the endpoint (its translated tuple was another connection's: one
// client port, two service addresses, one endpoint); svcproxy_remap holds the
// other port of each entry.
#define CT_REMAPPED 0x10
// CT_ORIGINAL's, between the choice of an endpoint and the tc ingress program
// (decide.h: remap_new): the translated tuple's reply entry names another
// service address; the new connection's own reply entry is not made yet.
#define CT_REMAP_WANTED 0x20

// The packet path's idle timeouts, in seconds (0: none; the LRU alone forgets):
// kube-proxy's --ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout.
struct timeouts {
	__u32 tcp;
	__u32 tcpfin;
	__u32 udp;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct timeouts);
} svcproxy_timeouts SEC(".maps");

static __always_inline __u32 now_s(void)
{
	return bpf_ktime_get_ns() / 1000000000ULL;
}

// Whether a connection has been idle longer than its timeout (TCP: tcpfin once
// a FIN or RST passed, else tcp; UDP: udp).
static __always_inline int idle_expired(const struct ct_val *ct, int tcp)
{
	__u32 zero = 0;
	struct timeouts *t = bpf_map_lookup_elem(&svcproxy_timeouts, &zero);
	if (!t)
		return 0;
	__u32 limit = !tcp ? t->udp : (ct->flags & CT_CLOSING) ? t->tcpfin : t->tcp;
	// seen_s 0: an entry a release without idle timeouts wrote, never touched.
	return limit && ct->seen_s && now_s() - ct->seen_s > limit;
}

// A packet of the connection passed: it is not idle (written at most once a
// second).
static __always_inline void touch(struct ct_val *ct)
{
	__u32 now = now_s();
	if (ct->seen_s != now)
		ct->seen_s = now;
}

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
} svcproxy_ct SEC(".maps");

// A remapped connection's other port (network order), by the key of its entry
// in svcproxy_ct: for CT_ORIGINAL the port its packets leave with toward the
// endpoint, for CT_REPLY the client's own port its replies are given back.
struct remap_val {
	__u16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct ct_key);
	__type(value, struct remap_val);
} svcproxy_remap SEC(".maps");

// A connection's key from its parts (ports in network order; dir CT_*).
static __always_inline void ct_key_make(struct ct_key *k, const __u32 *saddr, const __u32 *daddr,
					__u16 sport, __u16 dport, __u8 proto, __u8 family, __u8 dir)
{
	__builtin_memset(k, 0, sizeof(*k));
	addr_copy(k->saddr, saddr);
	addr_copy(k->daddr, daddr);
	k->sport = sport;
	k->dport = dport;
	k->proto = proto;
	k->family = family;
	k->dir = dir;
}

static __always_inline void ct_key_of(struct ct_key *k, const struct pkt *p)
{
	ct_key_make(k, p->saddr, p->daddr, p->sport, p->dport, p->proto, p->family, CT_ORIGINAL);
}

// How long a masqueraded UDP flow's replies are expected after its last packet
// out: the kernel's conntrack keeps a UDP flow that had replies this long
// (nf_conntrack_udp_timeout_stream), and its masquerade with it.
#define MASQUERADED_REPLY_NS (120ULL * 1000000000ULL)
// A flow's expectation is renewed by its packets out at most this often.
#define MASQUERADED_RENEW_NS (1000000000ULL)

// The replies of a masqueraded UDP flow whose packet `p` is (after the
// masquerade): from its destination to its new source.
static __always_inline void expect_masqueraded_reply(const struct pkt *p)
{
	struct ct_key k;
	ct_key_make(&k, p->daddr, p->saddr, p->dport, p->sport, p->proto,
		    p->family, CT_MASQUERADED_REPLY);
	__u64 now = bpf_ktime_get_ns();
	struct ct_val *seen = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (seen && now - seen->created_ns < MASQUERADED_RENEW_NS)
		return;
	struct ct_val v = {};
	v.created_ns = now;
	bpf_map_update_elem(&svcproxy_ct, &k, &v, BPF_ANY);
}

// A UDP datagram that a masqueraded flow expects (expect_masqueraded_reply).
static __always_inline int masqueraded_reply(const struct pkt *p)
{
	struct ct_key k;
	ct_key_of(&k, p);
	k.dir = CT_MASQUERADED_REPLY;
	struct ct_val *v = bpf_map_lookup_elem(&svcproxy_ct, &k);
	return v && bpf_ktime_get_ns() - v->created_ns <= MASQUERADED_REPLY_NS;
}

// A connection the lc scheduler counted ends (its first FIN or RST, either
// way, or its client port reused): its endpoint's count goes down, once.
static __always_inline void release_flow(struct ct_val *ct, __u8 family)
{
	if (!ct->counted)
		return;
	ct->counted = 0;
	count_release(&svcproxy_flows, ct->addr, ct->port, family);
}

#endif
