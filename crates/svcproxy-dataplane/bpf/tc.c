// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// svcproxy's packet path: tc programs on the node's interfaces for packets that
// no local socket translated (NodePorts, external IPs and load-balancer IPs
// reached from outside; cluster IPs reached from another host; pods whose
// sockets are left to the packet path). The ingress program translates a new
// connection's first packet to an endpoint and remembers the choice both ways
// (svcproxy_ct); the egress program shows the service address as the source of
// the endpoint's replies.
//
// As in sock.c, the programs decide nothing: each route (forward to a list,
// drop, reject, masquerade or not) is the intent's, written into the maps by
// svcproxy. Two fixed nftables rules act on the marks set here: masquerade
// (the kernel's conntrack then owns the source port and un-masquerades the
// replies before they reach the egress program), and reject (a TCP reset or an
// ICMP port unreachable, which a tc program cannot send).
//
// A program that lets a packet go on returns TC_ACT_UNSPEC (tcx's TCX_NEXT):
// the programs attached after it on the interface (a CNI's) still run.

#include "svcproxy.h"
#include <stddef.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

// svcproxy_ifc's flags: packets arriving here come from this node's pods.
#define IFC_PODS 1

// A SYN again within this time of the choice is a retransmission of the same
// connection (Linux retries at 1, 3, 7, 15, 31 s): it keeps the endpoint chosen
// for the first. A new connection from the same client port comes only after
// the old one's TIME_WAIT (60 s).
#define SYN_RETRY_NS (60ULL * 1000000000ULL)

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
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct podnet_key);
	__type(value, __u8);
} svcproxy_podnet SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} svcproxy_ifc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct ct_key);
	__type(value, struct ct_val);
} svcproxy_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct aff_ip_key);
	__type(value, struct aff_val);
} svcproxy_affip SEC(".maps");

// One packet's addresses, ports and where its headers are.
struct pkt {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport; // network order
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 tcp_flags;
	__u8 pseudo; // the L4 checksum covers the addresses (all but ICMPv4)
	__u32 l4_off;
	__u32 end;	  // where the IP packet ends (the frame may be padded)
	__u32 csum_off;	  // the TCP, UDP or ICMP checksum
	__u32 csum_flags; // BPF_F_MARK_MANGLED_0 for UDP (an IPv4 checksum of 0 is none)
	// The XDP program's: the TCP or UDP checksum and the length it covers.
	__u16 l4_check;
	__u16 l4_len;
};

// An unfragmented IPv4 or IPv6 TCP, UDP or ICMP packet after an Ethernet
// header (an ICMP packet's ports are 0); 0 for anything else (left alone).
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__builtin_memset(p, 0, sizeof(*p));
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return 0;
		if (ip.ihl < 5 || (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return 0;
		p->family = FAMILY_V4;
		p->proto = ip.protocol;
		p->saddr[0] = ip.saddr;
		p->daddr[0] = ip.daddr;
		p->l4_off = ETH_HLEN + ip.ihl * 4;
		p->end = ETH_HLEN + bpf_ntohs(ip.tot_len);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return 0;
		p->family = FAMILY_V6;
		// Extension headers (fragments included) are left alone.
		p->proto = ip6.nexthdr;
		__builtin_memcpy(p->saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->daddr, &ip6.daddr, 16);
		p->l4_off = ETH_HLEN + sizeof(ip6);
		p->end = p->l4_off + bpf_ntohs(ip6.payload_len);
	} else {
		return 0;
	}
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr th;
		if (bpf_skb_load_bytes(skb, p->l4_off, &th, sizeof(th)) < 0)
			return 0;
		p->sport = th.source;
		p->dport = th.dest;
		p->tcp_flags = ((__u8 *)&th)[13];
		p->pseudo = 1;
		p->csum_off = p->l4_off + offsetof(struct tcphdr, check);
	} else if (p->proto == IPPROTO_UDP) {
		struct udphdr uh;
		if (bpf_skb_load_bytes(skb, p->l4_off, &uh, sizeof(uh)) < 0)
			return 0;
		p->sport = uh.source;
		p->dport = uh.dest;
		p->pseudo = 1;
		p->csum_off = p->l4_off + offsetof(struct udphdr, check);
		p->csum_flags = BPF_F_MARK_MANGLED_0;
	} else if ((p->family == FAMILY_V4 && p->proto == IPPROTO_ICMP) ||
		   (p->family == FAMILY_V6 && p->proto == IPPROTO_ICMPV6)) {
		p->csum_off = p->l4_off + 2;
		p->pseudo = p->family == FAMILY_V6;
		return 1;
	} else {
		// SCTP's CRC32c covers the ports and cannot be patched: SCTP from
		// outside is not translated here.
		return 0;
	}
	return 1;
}

// Rewrites the packet's destination (dst) or source address and port, with
// the checksums.
static __always_inline int rewrite(struct __sk_buff *skb, const struct pkt *p, int dst,
				   const __u32 *addr, __u16 port)
{
	__u32 old[4], new[4];
	addr_copy(old, dst ? p->daddr : p->saddr);
	addr_copy(new, addr);
	__u16 old_port = dst ? p->dport : p->sport;
	__s64 diff;
	__u32 off;
	if (p->family == FAMILY_V4) {
		diff = bpf_csum_diff(old, 4, new, 4, 0);
		off = ETH_HLEN + (dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
		if (diff < 0 ||
		    bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), 0, diff, 0))
			return 0;
	} else {
		diff = bpf_csum_diff(old, 16, new, 16, 0);
		off = ETH_HLEN +
		      (dst ? offsetof(struct ipv6hdr, daddr) : offsetof(struct ipv6hdr, saddr));
		if (diff < 0)
			return 0;
	}
	if (p->pseudo &&
	    bpf_l4_csum_replace(skb, p->csum_off, 0, diff, BPF_F_PSEUDO_HDR | p->csum_flags))
		return 0;
	// An IPv6 address has no header checksum to absorb its change: a packet
	// whose checksum the device gave whole (CHECKSUM_COMPLETE) has its sum
	// brought along (the L4 update above assumed IPv4's compensation).
	if (bpf_skb_store_bytes(skb, off, new, p->family == FAMILY_V4 ? 4 : 16,
				p->family == FAMILY_V4 ? 0 : BPF_F_RECOMPUTE_CSUM))
		return 0;
	if (port != old_port) {
		if (bpf_l4_csum_replace(skb, p->csum_off, old_port, port,
					sizeof(__u16) | p->csum_flags))
			return 0;
		__u32 port_off = p->l4_off + (dst ? offsetof(struct udphdr, dest)
						  : offsetof(struct udphdr, source));
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0))
			return 0;
	}
	return 1;
}

// The packet comes from one of this node's pods (the intent's local_traffic:
// its interface, or its source among the pods' CIDRs).
static __always_inline int from_pod(__u32 ifindex, const struct pkt *p)
{
	__u32 *flags = bpf_map_lookup_elem(&svcproxy_ifc, &ifindex);
	if (flags && (*flags & IFC_PODS))
		return 1;
	struct podnet_key k = {};
	k.prefixlen = 32 + (p->family == FAMILY_V4 ? 32 : 128);
	k.family = p->family;
	addr_copy(k.addr, p->saddr);
	return bpf_map_lookup_elem(&svcproxy_podnet, &k) != 0;
}

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

// A UDP datagram that answers one of this node's own connected sockets (a
// process talking from a port that is also a NodePort): the kernel's conntrack
// knows it as a reply, and the packet modes leave it alone; so does this one.
static __always_inline int answers_local_socket(void *ctx, const struct pkt *p)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	if (p->family == FAMILY_V4) {
		t.ipv4.saddr = p->saddr[0];
		t.ipv4.daddr = p->daddr[0];
		t.ipv4.sport = p->sport;
		t.ipv4.dport = p->dport;
		sk = bpf_sk_lookup_udp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	} else {
		__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->daddr, 16);
		t.ipv6.sport = p->sport;
		t.ipv6.dport = p->dport;
		sk = bpf_sk_lookup_udp(ctx, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return 0;
	// Each field read once, straight from the socket (the verifier refuses
	// arithmetic on a socket pointer).
	__u32 peer[4] = { sk->dst_ip6[0], sk->dst_ip6[1], sk->dst_ip6[2], sk->dst_ip6[3] };
	__u32 peer4 = sk->dst_ip4;
	__u16 peer_port = sk->dst_port;
	bpf_sk_release(sk);
	if (p->family == FAMILY_V4) {
		peer[0] = peer4;
		peer[1] = 0;
		peer[2] = 0;
		peer[3] = 0;
	}
	return peer_port == p->sport && addr_eq(peer, p->saddr);
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

// The hashing schedulers' input for a packet: the client's address (sh), the
// service address (dh), the client's address and port (mh, as IPVS's
// mh-port); never the node's, so that every node makes the same choice for a
// flow.
static __always_inline __u32 sched_hash(const struct pkt *p, const struct route *rt)
{
	switch (rt->sched) {
	case SCHED_SH:
		return hash_addr(0, p->saddr);
	case SCHED_DH:
		return hash_addr(0, p->daddr);
	case SCHED_MH:
		return mix(hash_addr(0, p->saddr), ((__u32)p->sport << 16) | p->proto);
	default:
		return 0;
	}
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

// A new connection: its route's endpoint, remembered both ways. 0 when the
// packet goes on untranslated (the list being replaced under us).
static __always_inline int choose(const struct pkt *p, const struct svc_val *svc,
				  const struct route *rt, struct ct_val *out)
{
	// Where the endpoint is found (a map's value), copied once below.
	const struct backend *found = 0;
	struct aff_ip_key ak = {};
	if (svc->affinity_secs) {
		ak.affinity_id = svc->affinity_id;
		addr_copy(ak.client, p->saddr);
		struct aff_val *av = bpf_map_lookup_elem(&svcproxy_affip, &ak);
		if (av && bpf_ktime_get_ns() - av->last_ns <= (__u64)svc->affinity_secs * 1000000000ULL &&
		    is_member(rt->list, &av->be))
			found = &av->be;
	}
	if (!found)
		found = pick(rt, sched_hash(p, rt));
	if (!found)
		return 0;
	struct backend be;
	__builtin_memcpy(&be, found, sizeof(be));
	if (svc->affinity_secs) {
		// Zeroed first: the padding must not be uninitialised stack.
		struct aff_val nv;
		__builtin_memset(&nv, 0, sizeof(nv));
		nv.be = be;
		nv.last_ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&svcproxy_affip, &ak, &nv, BPF_ANY);
	}

	__builtin_memset(out, 0, sizeof(*out));
	addr_copy(out->addr, be.addr);
	out->port = be.port;
	// A connection from an endpoint to itself is always masqueraded, or its
	// replies would never come back through this node.
	out->flags = (rt->flags & ROUTE_MASQUERADE) || addr_eq(p->saddr, be.addr)
			     ? ROUTE_MASQUERADE
			     : 0;
	out->created_ns = bpf_ktime_get_ns();
	out->seen_s = out->created_ns / 1000000000ULL;
	if (COUNTS_CONNS(rt->sched) && p->proto == IPPROTO_TCP) {
		count_add(&svcproxy_flows, &be, 1);
		out->counted = 1;
	}

	struct ct_key k;
	ct_key_of(&k, p);
	bpf_map_update_elem(&svcproxy_ct, &k, out, BPF_ANY);
	struct ct_key rk;
	ct_key_make(&rk, be.addr, p->saddr, be.port, p->sport, p->proto,
		    p->family, CT_REPLY);
	struct ct_val rv = {};
	addr_copy(rv.addr, p->daddr);
	rv.port = p->dport;
	rv.created_ns = out->created_ns;
	bpf_map_update_elem(&svcproxy_ct, &rk, &rv, BPF_ANY);
	return 1;
}

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

// A reply of a connection the XDP program sent on from its first packet, not
// masqueraded (the Local policy's): marked as svcproxy's own masquerade's
// replies are, for the same reason (the kernel's conntrack never saw the
// connection, and must not take its replies for a new flow of their own).
static __noinline int xdp_reply(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 zero = 0;
	struct snat_range *r = bpf_map_lookup_elem(&svcproxy_snat, &zero);
	if (!r || !(r->flags & SNAT_XDP) || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return TC_ACT_UNSPEC;
	struct ct_key k;
	ct_key_of(&k, p);
	k.dir = CT_REPLY;
	struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (ct && (ct->flags & CT_XDP))
		mark_snat(skb);
	return TC_ACT_UNSPEC;
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

// ICMP errors (RFC 792, 4443) that quote a packet: destination unreachable
// (packet too big and fragmentation needed included), time exceeded,
// parameter problem.
#define ICMP_ERR_UNREACH 3
#define ICMP_ERR_TIME 11
#define ICMP_ERR_PARAM 12
#define ICMP6_ERR_FIRST 1 // unreachable, too big, time exceeded, parameter problem
#define ICMP6_ERR_LAST 4

// The 16-bit checksum `check` after the words of `from` became those of `to`
// (sizes in bytes, multiples of 4).
static __always_inline __u16 csum_update(__u16 check, __u32 *from, __u32 *to, __u32 size)
{
	__s64 sum = bpf_csum_diff(from, size, to, size, (__u32)(__u16)~check);
	__u32 c = (__u32)sum;
	c = (c & 0xffff) + (c >> 16);
	c = (c & 0xffff) + (c >> 16);
	return (__u16)~c;
}

// The packet an ICMP error quotes (icmp_quoted): where its header and its
// TCP or UDP header are, its addresses, ports and protocol.
struct icmp_quote {
	__u32 in_off;
	__u32 in_l4;
	__u32 qs[4];
	__u32 qd[4];
	__u16 ports[2];
	__u8 proto;
	__u8 pad[3];
};

// Whether the ICMP packet `p` is an error that quotes a TCP or UDP packet,
// into `q`.
static __always_inline int icmp_quoted(struct __sk_buff *skb, const struct pkt *p,
				       struct icmp_quote *q)
{
	__u8 type;
	if (bpf_skb_load_bytes(skb, p->l4_off, &type, 1) < 0)
		return 0;
	if (p->family == FAMILY_V4 ? type != ICMP_ERR_UNREACH && type != ICMP_ERR_TIME &&
					     type != ICMP_ERR_PARAM
				   : type < ICMP6_ERR_FIRST || type > ICMP6_ERR_LAST)
		return 0;
	// The quoted packet: its header, and the first 8 bytes of its TCP or UDP
	// header (all an ICMPv4 error must quote).
	__builtin_memset(q, 0, sizeof(*q));
	q->in_off = p->l4_off + 8;
	if (p->family == FAMILY_V4) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, q->in_off, &ip, sizeof(ip)) < 0)
			return 0;
		if (ip.ihl < 5 || (ip.frag_off & bpf_htons(IP_OFFSET)))
			return 0;
		q->proto = ip.protocol;
		q->qs[0] = ip.saddr;
		q->qd[0] = ip.daddr;
		q->in_l4 = q->in_off + ip.ihl * 4;
	} else {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, q->in_off, &ip6, sizeof(ip6)) < 0)
			return 0;
		q->proto = ip6.nexthdr;
		__builtin_memcpy(q->qs, &ip6.saddr, 16);
		__builtin_memcpy(q->qd, &ip6.daddr, 16);
		q->in_l4 = q->in_off + sizeof(ip6);
	}
	if (q->proto != IPPROTO_TCP && q->proto != IPPROTO_UDP)
		return 0;
	if (q->in_l4 + 4 > p->end || bpf_skb_load_bytes(skb, q->in_l4, q->ports, 4) < 0)
		return 0;
	return 1;
}

// What icmp_translate changes: the quoted packet's source address and port
// and the error's destination; the quoted destination and the error's source;
// the quoted destination alone.
#define ICMP_QUOTED_SRC 1
#define ICMP_QUOTED_DST 0
#define ICMP_QUOTED_DST_ONLY 2

// Translates one side of an ICMP error (`side`, ICMP_QUOTED_*) to `to`'s
// address and port. The quoted IPv4 header's checksum, the quoted TCP or UDP
// checksum (when quoted) and the ICMP checksum follow.
static __noinline int icmp_translate(struct __sk_buff *skb, const struct pkt *p,
				     const struct icmp_quote *q, int side, const struct ct_val *to)
{
	int src = side == ICMP_QUOTED_SRC;
	__u32 in_off = q->in_off, in_l4 = q->in_l4, check_off = 0;
	__u32 addr_off;
	if (p->family == FAMILY_V4)
		addr_off = in_off + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr));
	else
		addr_off = in_off +
			   (src ? offsetof(struct ipv6hdr, saddr) : offsetof(struct ipv6hdr, daddr));
	// old/new: the quoted address [0-3], ports [4], the IPv4 header's
	// ttl/protocol/checksum word [5], the word with the quoted checksum [6].
	__u32 old[8] = {}, new[8] = {};
	// The address as the packet holds it now (read, not chosen between q's
	// two: a pointer offset by a register is refused without CAP_PERFMON).
	if (bpf_skb_load_bytes(skb, in_l4, &old[4], 4) < 0 ||
	    (p->family == FAMILY_V4 ? bpf_skb_load_bytes(skb, addr_off, old, 4)
				    : bpf_skb_load_bytes(skb, addr_off, old, 16)) < 0)
		return TC_ACT_UNSPEC;
	addr_copy(new, to->addr);
	__u16 half[2];
	__builtin_memcpy(half, &old[4], 4);
	if (src)
		half[0] = to->port;
	else
		half[1] = to->port;
	__builtin_memcpy(&new[4], half, 4);
	if (p->family == FAMILY_V4) {
		// The quoted header's checksum, the second half of its word.
		if (bpf_skb_load_bytes(skb, in_off + 8, &old[5], 4) < 0)
			return TC_ACT_UNSPEC;
		__builtin_memcpy(half, &old[5], 4);
		half[1] = csum_update(half[1], old, new, 4);
		__builtin_memcpy(&new[5], half, 4);
	}
	// The quoted TCP or UDP checksum, when quoted (UDP's 0: none): the first
	// half of TCP's word at 16, the second of UDP's at 4.
	__u32 word_off = in_l4 + (q->proto == IPPROTO_TCP ? 16 : 4);
	if (word_off + 4 <= p->end && bpf_skb_load_bytes(skb, word_off, &old[6], 4) == 0) {
		__builtin_memcpy(half, &old[6], 4);
		if (q->proto == IPPROTO_TCP) {
			half[0] = csum_update(half[0], old, new, 20);
			check_off = word_off;
		} else if (half[1]) {
			half[1] = csum_update(half[1], old, new, 20);
			check_off = word_off;
		}
		__builtin_memcpy(&new[6], half, 4);
	}

	// The ICMP checksum covers all that changed.
	__u16 icmp_check;
	if (bpf_skb_load_bytes(skb, p->csum_off, &icmp_check, 2) < 0)
		return TC_ACT_UNSPEC;
	icmp_check = csum_update(icmp_check, old, new, sizeof(old));
	if (bpf_skb_store_bytes(skb, addr_off, new, p->family == FAMILY_V4 ? 4 : 16, 0) ||
	    bpf_skb_store_bytes(skb, in_l4, &new[4], 4, 0) ||
	    (p->family == FAMILY_V4 && bpf_skb_store_bytes(skb, in_off + 8, &new[5], 4, 0)) ||
	    (check_off && bpf_skb_store_bytes(skb, check_off, &new[6], 4, 0)) ||
	    bpf_skb_store_bytes(skb, p->csum_off, &icmp_check, 2, 0))
		return TC_ACT_SHOT;
	if (side != ICMP_QUOTED_DST_ONLY && !rewrite(skb, p, src, to->addr, 0))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

// An ICMP error about a packet of a connection translated here: the quoted
// packet and the error's own address are translated as that connection's
// packets are, so the client (or the endpoint) matches the error with its
// socket (a refused UDP port, a path MTU), as the kernel's conntrack does for
// the packet modes (nf_nat_icmp_reply_translation). On ingress the error is
// about a reply (quoted: service address to client) and goes on to the
// endpoint, or about a packet svcproxy masqueraded (quoted: the node's address
// to the endpoint) and goes on to the client; on egress it is about the
// client's packet (quoted: client to endpoint) and goes on to the client, from
// the service address.
static __noinline int icmp_error(struct __sk_buff *skb, const struct pkt *p, int ingress)
{
	struct icmp_quote q;
	if (!icmp_quoted(skb, p, &q))
		return TC_ACT_UNSPEC;
	// The quoted packet turned round is the connection's own, this way.
	struct ct_key k;
	ct_key_make(&k, q.qd, q.qs, q.ports[1], q.ports[0], q.proto,
		    p->family, ingress ? CT_ORIGINAL : CT_REPLY);
	struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!ct && ingress) {
		// The endpoint's error about the client's packet (quoted: client to
		// endpoint) of a connection the XDP program sent on: kept from the
		// conntrack as its replies are (the egress program translates it).
		k.dir = CT_REPLY;
		struct ct_val *back = bpf_map_lookup_elem(&svcproxy_ct, &k);
		if (back) {
			if (back->flags & CT_XDP)
				mark_snat(skb);
			return TC_ACT_UNSPEC;
		}
	}
	if (!ct) {
		// About a packet svcproxy masqueraded (ingress: from the endpoint's
		// side, quoting the node's address and port), or about a reply to
		// such a connection that the node itself answers with an error on
		// its way to the client (egress: the endpoint knows the client by the
		// node's address and port).
		k.dir = ingress ? CT_SNAT_REPLY : CT_SNAT;
		ct = bpf_map_lookup_elem(&svcproxy_ct, &k);
		if (!ct)
			return TC_ACT_UNSPEC;
		struct ct_val by = *ct;
		if (ingress)
			mark_snat(skb);
		return icmp_translate(skb, p, &q, ingress ? ICMP_QUOTED_SRC : ICMP_QUOTED_DST_ONLY,
				      &by);
	}
	struct ct_val to = *ct;
	int verdict = icmp_translate(skb, p, &q, ingress ? ICMP_QUOTED_SRC : ICMP_QUOTED_DST, &to);
	if (verdict != TC_ACT_UNSPEC || !ingress)
		return verdict;
	if (!(to.flags & CT_BPF_SNAT)) {
		// The client's error about a reply of a connection the XDP program
		// sent on without masquerade: kept from the conntrack too.
		addr_copy(k.saddr, to.addr);
		addr_copy(k.daddr, q.qd);
		k.sport = to.port;
		k.dport = q.ports[1];
		k.dir = CT_REPLY;
		struct ct_val *back = bpf_map_lookup_elem(&svcproxy_ct, &k);
		if (back && (back->flags & CT_XDP))
			mark_snat(skb);
		return verdict;
	}
	mark_snat(skb);
	// The endpoint knows the client by the node's address and port svcproxy
	// masqueraded it to: the quoted destination. The error keeps its source (a
	// packet from one of the node's own addresses would not be forwarded; the
	// endpoint's kernel matches an error by what it quotes). The key and the
	// value reused: the stack is short.
	addr_copy(k.saddr, q.qd);
	addr_copy(k.daddr, to.addr);
	k.sport = q.ports[1];
	k.dport = to.port;
	k.dir = CT_SNAT;
	struct ct_val *nat = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!nat)
		return verdict;
	to = *nat;
	return icmp_translate(skb, p, &q, ICMP_QUOTED_DST_ONLY, &to);
}

// What becomes of a packet arriving from outside this host's sockets: the
// decision the tc ingress and the XDP programs share (the XDP program makes it
// first where it runs; tc, meeting the same packet after an XDP_PASS, finds the
// connection it recorded and makes the same one). `ifindex`: the interface it
// arrived on. VERDICT_FORWARD fills `flow` with the endpoint (and whether to
// masquerade).
#define VERDICT_PASS 0
#define VERDICT_DROP 1
#define VERDICT_REJECT 2
#define VERDICT_FORWARD 3

static __noinline int decide(void *ctx, const struct pkt *p, __u32 ifindex,
			    struct ct_val *flow)
{
	int tcp = p->proto == IPPROTO_TCP;
	int syn = tcp && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	struct ct_key k;
	ct_key_of(&k, p);
	struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (ct && syn &&
	    (bpf_ktime_get_ns() - ct->created_ns > SYN_RETRY_NS || (ct->flags & CT_CLOSING))) {
		// A new connection from a port used before (a SYN after the old
		// one's FIN or RST is no retransmission).
		release_flow(ct, p->family);
		ct = 0;
	}
	if (ct && tcp && !syn && idle_expired(ct, 1)) {
		// Idle past --ipvs-tcp-timeout (or -tcpfin-): forgotten, as IPVS
		// forgets it; its packets now meet no connection here.
		release_flow(ct, p->family);
		bpf_map_delete_elem(&svcproxy_ct, &k);
		ct = 0;
	}
	if (ct && tcp) {
		if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) {
			release_flow(ct, p->family);
			ct->flags |= CT_CLOSING;
		}
		touch(ct);
		*flow = *ct;
	} else if (tcp && !syn) {
		// Mid-stream TCP that no connection here began (replies, the node's
		// own traffic): not ours, and no service lookup for it.
		return VERDICT_PASS;
	} else {
		struct svc_key key = {};
		addr_copy(key.addr, p->daddr);
		key.port = p->dport;
		key.proto = p->proto;
		key.family = p->family;
		struct svc_val *svc = find_service(&key);
		if (!svc) {
			switch (guard(&key)) {
			case GUARD_REJECT:
				return VERDICT_REJECT;
			case GUARD_DROP:
				return VERDICT_DROP;
			}
			return VERDICT_PASS;
		}
		if (!ct && !tcp && (masqueraded_reply(p) || answers_local_socket(ctx, p)))
			return VERDICT_PASS;
		const struct route *rt = from_pod(ifindex, p) ? &svc->pkt_pod : &svc->pkt_other;
		struct backend prev = {};
		if (ct) {
			addr_copy(prev.addr, ct->addr);
			prev.port = ct->port;
		}
		if (ct && rt->action == ACT_FORWARD && is_member(rt->list, &prev) &&
		    !idle_expired(ct, 0)) {
			// A UDP flow keeps its endpoint while it stays in the list (and
			// is not idle past --ipvs-udp-timeout).
			touch(ct);
			*flow = *ct;
		} else {
			if (svc->fw_id && !admitted(svc, p->family, p->saddr))
				return VERDICT_DROP;
			switch (rt->action) {
			case ACT_FORWARD:
				break;
			case ACT_DROP:
				return VERDICT_DROP;
			case ACT_PASS:
				return VERDICT_PASS;
			default:
				return VERDICT_REJECT;
			}
			if (rt->count == 0)
				return VERDICT_REJECT;
			if (!choose(p, svc, rt, flow))
				return VERDICT_PASS;
			flow->flags |= CT_FRESH;
		}
	}
	return VERDICT_FORWARD;
}

SEC("classifier")
int svcproxy_tc_ingress(struct __sk_buff *skb)
{
	struct pkt p;
	if (!parse(skb, &p))
		return TC_ACT_UNSPEC;
	if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6)
		return icmp_error(skb, &p, 1);
	struct config *cfg = config();
	if (!cfg)
		return TC_ACT_UNSPEC;
	int back = snat_reply(skb, &p);
	if (back != NOT_SNAT_REPLY)
		return back;
	struct ct_val flow;
	switch (decide(skb, &p, skb->ingress_ifindex, &flow)) {
	case VERDICT_FORWARD:
		break;
	case VERDICT_DROP:
		return TC_ACT_SHOT;
	case VERDICT_REJECT:
		skb->mark |= cfg->reject_mark;
		return TC_ACT_UNSPEC;
	default:
		return xdp_reply(skb, &p);
	}
	// Masqueraded by svcproxy (both marks: the egress program gives the
	// source), or by the kernel (the fixed rule).
	__u32 marks = 0;
	if (flow.flags & CT_BPF_SNAT) {
		if (!snat_known(&p, &flow))
			return TC_ACT_SHOT;
		marks = cfg->masquerade_mark | cfg->reject_mark;
	} else if (flow.flags & ROUTE_MASQUERADE) {
		marks = cfg->masquerade_mark;
	}
	skb->mark |= marks;
	// A packet half rewritten (a helper failed) would carry a wrong checksum.
	if (!rewrite(skb, &p, 1, flow.addr, flow.port))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

// An endpoint's reply on its way out: the service address shown as its
// source, its connection touched (noinline: its own stack frame, apart from
// the ICMP path's).
static __noinline int reply_egress(struct __sk_buff *skb, const struct pkt *p, int ours)
{
	struct ct_key k;
	ct_key_of(&k, p);
	k.dir = CT_REPLY;
	struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!ct)
		// A packet marked as svcproxy's own masquerade's that is no packet of
		// such a connection any more: dropped rather than sent with the
		// client's address (to the endpoint) or the endpoint's (to the client).
		return ours ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	struct ct_val back = *ct;
	int closing = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST));
	// A reply keeps its connection from idling out: the client's side of it (its
	// original entry) is touched at most once a second, and told of a FIN or
	// RST, which the lc scheduler's count is given back at.
	__u32 now = now_s();
	if (closing || ct->seen_s != now) {
		ct->seen_s = now;
		struct ct_key ok;
		ct_key_make(&ok, p->daddr, back.addr, p->dport, back.port, p->proto,
			    p->family, CT_ORIGINAL);
		struct ct_val *orig = bpf_map_lookup_elem(&svcproxy_ct, &ok);
		if (orig) {
			touch(orig);
			if (closing) {
				release_flow(orig, p->family);
				orig->flags |= CT_CLOSING;
			}
		}
	}
	if (!rewrite(skb, p, 0, back.addr, back.port))
		return TC_ACT_SHOT;
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int svcproxy_tc_egress(struct __sk_buff *skb)
{
	struct pkt p;
	int parsed = parse(skb, &p);
	struct config *cfg = config();
	__u32 both = cfg ? cfg->masquerade_mark | cfg->reject_mark : 0;
	// A packet of a connection svcproxy masquerades itself (both marks): the
	// marks leave with it no further. One the node fragmented on the way
	// (longer than the MTU, and allowed to be fragmented) cannot be given its
	// source: dropped, rather than leaving with the client's.
	int ours = both && (skb->mark & both) == both;
	if (ours)
		skb->mark &= ~both;
	if (!parsed)
		return ours ? TC_ACT_SHOT : TC_ACT_UNSPEC;
	if (p.proto == IPPROTO_ICMP || p.proto == IPPROTO_ICMPV6)
		return icmp_error(skb, &p, 0);
	if (ours) {
		int verdict = snat_egress(skb, &p);
		if (verdict != NOT_SNAT_REPLY)
			return verdict;
		return reply_egress(skb, &p, 1);
	}
	if (cfg && (skb->mark & cfg->masquerade_mark)) {
		// Masqueraded by the fixed rule (postrouting is behind us): the mark
		// has done its work and leaves with the packet no further. A UDP
		// flow's replies will come to the port the kernel chose, which may be
		// a NodePort's: remembered, so ingress leaves them to the kernel.
		skb->mark &= ~cfg->masquerade_mark;
		if (p.proto == IPPROTO_UDP)
			expect_masqueraded_reply(&p);
	}
	return reply_egress(skb, &p, 0);
}

// The XDP fast path (--ebpf-xdp=native): on the node's interfaces from
// outside whose driver runs XDP, a connection's packets that need nothing of
// the kernel (no masquerade, no reject, no fragment, no IP option) are
// translated and sent on to the endpoint's interface here, before the kernel
// builds a socket buffer; drops are made here too. Everything else goes on
// untranslated (XDP_PASS) to the tc program, which finds what was decided
// here and finishes it. Only interfaces svcproxy found able to take frames
// redirected to them (their kernel XDP features: a veth whose peer runs NAPI,
// a driver with ndo_xdp_xmit) are sent to: others meet the stack as before.

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

static __always_inline int xdp_count(__u32 stat, int action)
{
	__u64 *n = bpf_map_lookup_elem(&svcproxy_xdp_stats, &stat);
	if (n)
		*n += 1;
	return action;
}

// Counts what xdp_send did: sent on, or (no TTL left) left to the stack.
static __always_inline int xdp_sent(int action)
{
	return xdp_count(action == XDP_PASS ? XDP_STAT_PASS : XDP_STAT_FORWARD, action);
}

// Makes a packet pointer opaque to the compiler, so that two branches'
// pointers are not merged into one base plus a register offset: without
// CAP_PERFMON (the DaemonSet grants BPF, NET_ADMIN, NET_RAW) the verifier
// refuses a packet pointer plus a register, even a known one, and a packet
// pointer compared with null. So the XDP program keeps no packet pointer
// between its steps: each step finds the headers again, at fixed offsets,
// bounds checked.
#define opaque(ptr) asm volatile("" : "+r"(ptr))

// A frame the XDP program may translate: Ethernet, an IPv4 header without
// options or an IPv6 header without extensions, then TCP or UDP (ICMP errors,
// SCTP, fragments and the rest are the tc program's).
static __always_inline int parse_xdp(struct xdp_md *ctx, struct pkt *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__builtin_memset(p, 0, sizeof(*p));
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	void *l4;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ihl != 5 ||
		    (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return 0;
		p->family = FAMILY_V4;
		p->proto = ip->protocol;
		p->saddr[0] = ip->saddr;
		p->daddr[0] = ip->daddr;
		p->l4_len = bpf_ntohs(ip->tot_len) - sizeof(struct iphdr);
		l4 = ip + 1;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return 0;
		p->family = FAMILY_V6;
		p->proto = ip6->nexthdr;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->l4_len = bpf_ntohs(ip6->payload_len);
		l4 = ip6 + 1;
	} else {
		return 0;
	}
	opaque(l4);
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > end)
			return 0;
		p->tcp_flags = ((__u8 *)th)[13];
		p->sport = th->source;
		p->dport = th->dest;
		__u16 *check = &th->check;
		opaque(check);
		p->l4_check = *check;
	} else if (p->proto == IPPROTO_UDP) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return 0;
		p->sport = uh->source;
		p->dport = uh->dest;
		__u16 *check = &uh->check;
		opaque(check);
		p->l4_check = *check;
	} else {
		return 0;
	}
	p->pseudo = 1;
	return 1;
}

// One's-complement arithmetic on 16-bit words as they lie in memory (RFC
// 1071, 1624), for the XDP program's checksums (no helper call).
static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

// The sum of an address's 16-bit words.
static __always_inline __u64 csum_words(const __u32 *addr, __u8 family)
{
	__u64 sum = (addr[0] & 0xffff) + (addr[0] >> 16);
	if (family == FAMILY_V6)
		for (int i = 1; i < 4; i++)
			sum += (addr[i] & 0xffff) + (addr[i] >> 16);
	return sum;
}

// The sum of an address's 16-bit words complemented (taken away).
static __always_inline __u64 csum_words_not(const __u32 *addr, __u8 family)
{
	__u32 w = ~addr[0];
	__u64 sum = (w & 0xffff) + (w >> 16);
	if (family == FAMILY_V6)
		for (int i = 1; i < 4; i++) {
			w = ~addr[i];
			sum += (w & 0xffff) + (w >> 16);
		}
	return sum;
}

// A checksum `check` after a change whose one's-complement difference is
// `delta` (RFC 1624: HC' = ~(~HC + ~m + m')).
static __always_inline __u16 csum_apply(__u16 check, __u16 delta)
{
	return ~csum_fold((__u64)(__u16)~check + delta);
}

// Whether the packet's TCP or UDP checksum is a partial one: its sender's
// device was to finish it (CHECKSUM_PARTIAL), which a veth never does, so the
// field holds the sum of the pseudo-header alone. Only the stack may carry such
// a packet on: a frame redirected from XDP loses the socket buffer's note of it,
// and its receiver would find the checksum wrong. (A complete checksum equal to
// that sum by chance, one in 65536, merely takes the stack's way too.)
static __always_inline int partial_csum(const struct pkt *p)
{
	__u64 sum = bpf_htons(p->proto) + bpf_htons(p->l4_len);
	sum += csum_words(p->saddr, p->family) + csum_words(p->daddr, p->family);
	return csum_fold(sum) == p->l4_check;
}

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

// Where a packet of `flow` goes from XDP, into `out`: 1 when the kernel's
// routing says where (a neighbour known, forwarding on, the MTU enough, the
// TTL left) and that interface takes redirected frames; 0 (the stack's way)
// otherwise.
static __noinline int xdp_route(struct xdp_md *ctx, const struct pkt *p,
			       const struct ct_val *flow, int want_src, struct xdp_fwd *out)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct bpf_fib_lookup fib = {};
	fib.ifindex = ctx->ingress_ifindex;
	fib.l4_protocol = p->proto;
	fib.sport = p->sport;
	fib.dport = flow->port;
	if (p->family == FAMILY_V4) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		if ((void *)(ip + 1) > end || ip->ttl <= 1)
			return 0;
		fib.family = 2; // AF_INET
		fib.tos = ip->tos;
		fib.tot_len = bpf_ntohs(ip->tot_len);
		fib.ipv4_src = p->saddr[0];
		fib.ipv4_dst = flow->addr[0];
	} else {
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		if ((void *)(ip6 + 1) > end || ip6->hop_limit <= 1)
			return 0;
		fib.family = 10; // AF_INET6
		fib.flowinfo = *(__be32 *)ip6 & bpf_htonl(0x0FFFFFFF);
		fib.tot_len = sizeof(struct ipv6hdr) + bpf_ntohs(ip6->payload_len);
		addr_copy(fib.ipv6_src, p->saddr);
		addr_copy(fib.ipv6_dst, flow->addr);
	}
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), want_src ? BPF_FIB_LOOKUP_SRC : 0) !=
	    BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	__u32 index = fib.ifindex;
	__u32 *mtu = bpf_map_lookup_elem(&svcproxy_xdp_tx, &index);
	if (!mtu)
		return 0;
	__builtin_memset(out, 0, sizeof(*out));
	out->mtu = *mtu;
	addr_copy(out->addr, flow->addr);
	out->port = flow->port;
	__builtin_memcpy(out->dmac, fib.dmac, ETH_ALEN);
	__builtin_memcpy(out->smac, fib.smac, ETH_ALEN);
	out->ifindex = index;
	// The source: the client's, or (want_src) the node's address the kernel
	// would give a packet leaving that way (its port is svcproxy's choice).
	addr_copy(out->saddr, p->saddr);
	out->sport = p->sport;
	if (want_src) {
		if (p->family == FAMILY_V4) {
			out->saddr[0] = fib.ipv4_src;
		} else {
			addr_copy(out->saddr, fib.ipv6_src);
		}
	}
	return 1;
}

// What the translation of `p` to `fwd`'s addresses and ports adds to the
// checksums: the old addresses' words taken away (added complemented), the new
// ones' added.
static __always_inline void xdp_deltas(const struct pkt *p, struct xdp_fwd *fwd)
{
	__u64 l3 = csum_words_not(p->daddr, p->family) + csum_words(fwd->addr, p->family) +
		   csum_words_not(p->saddr, p->family) + csum_words(fwd->saddr, p->family);
	fwd->l3_delta = csum_fold(l3);
	fwd->l4_delta = csum_fold(l3 + (__u16)~p->dport + fwd->port + (__u16)~p->sport + fwd->sport);
}

// The TCP or UDP header's checksum and destination port at `l4`, as `fwd`
// says (UDP over IPv4 without a checksum keeps none). 0 when the header is
// not all there.
static __always_inline int xdp_send_l4(const struct pkt *p, void *l4, void *end,
				       const struct xdp_fwd *fwd)
{
	if (p->proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > end)
			return 0;
		__u16 *check = &th->check;
		opaque(check);
		*check = csum_apply(*check, fwd->l4_delta);
		th->dest = fwd->port;
		th->source = fwd->sport;
	} else {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return 0;
		__u16 *check = &uh->check;
		opaque(check);
		// A zero UDP checksum stays zero (none over IPv4; over IPv6 the tc
		// program leaves it so too).
		if (*check) {
			__u16 c = csum_apply(*check, fwd->l4_delta);
			*check = c ? c : 0xffff;
		}
		uh->dest = fwd->port;
		uh->source = fwd->sport;
	}
	return 1;
}

// Sends the packet on as `fwd` says: the destination address and port, with
// the checksums that cover them, the TTL or hop limit lowered as a router
// does, the Ethernet addresses. Only a packet whose checksum is whole
// (partial_csum) may go.
static __always_inline int xdp_send(struct xdp_md *ctx, const struct pkt *p,
				    const struct xdp_fwd *fwd)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if (p->family == FAMILY_V4) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end || ip->ttl <= 1)
			return XDP_PASS;
		void *l4 = ip + 1;
		opaque(l4);
		if (!xdp_send_l4(p, l4, end, fwd))
			return XDP_PASS;
		// The TTL's word loses 0x0100 (its high byte), then the address.
		__u16 ttl_delta = (__u16)~bpf_htons(0x0100);
		ip->check = csum_apply(ip->check, csum_fold((__u64)fwd->l3_delta + ttl_delta));
		ip->ttl--;
		ip->daddr = fwd->addr[0];
		ip->saddr = fwd->saddr[0];
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end || ip6->hop_limit <= 1)
			return XDP_PASS;
		void *l4 = ip6 + 1;
		opaque(l4);
		if (!xdp_send_l4(p, l4, end, fwd))
			return XDP_PASS;
		__builtin_memcpy(&ip6->daddr, fwd->addr, 16);
		__builtin_memcpy(&ip6->saddr, fwd->saddr, 16);
		ip6->hop_limit--;
	}
	__builtin_memcpy(eth->h_dest, fwd->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fwd->smac, ETH_ALEN);
	if (fwd->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(fwd->ifindex, 0);
}

// The source a connection's packet leaves with from XDP, into `fwd`: the
// client's (no masquerade); the one svcproxy masqueraded the connection to; or,
// for a new connection, a port taken now (snat_alloc) from the address
// xdp_route found. 1 when the packet may go; 0 when it is the stack's (the
// kernel's conntrack masquerades the connection: it began there, or no port was
// free); -1 when it is to be dropped (its masquerade forgotten: the connection
// is over).
static __always_inline int xdp_source(const struct pkt *p, const struct ct_val *flow,
				      const struct ct_key *k, struct xdp_fwd *fwd)
{
	if (!(flow->flags & ROUTE_MASQUERADE))
		return 1;
	struct ct_key fk;
	ct_key_make(&fk, p->saddr, flow->addr, p->sport, flow->port, p->proto, p->family, CT_SNAT);
	struct ct_val nat;
	if (flow->flags & CT_BPF_SNAT) {
		int closing = p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST);
		if (!snat_out(&fk, closing, &nat))
			return -1;
	} else {
		if (!(flow->flags & CT_FRESH))
			return 0;
		// The connection (`k`, its key) is svcproxy's to masquerade from now
		// on, whichever program meets its packets.
		struct ct_val *ct = bpf_map_lookup_elem(&svcproxy_ct, k);
		if (!ct || !snat_alloc(&fk, fwd->saddr, &nat))
			return 0;
		ct->flags |= CT_BPF_SNAT;
	}
	addr_copy(fwd->saddr, nat.addr);
	fwd->sport = nat.port;
	return 1;
}

// A new connection goes from XDP: its reply entry says so (xdp_reply).
static __noinline void xdp_fresh(const struct pkt *p, const struct ct_val *flow)
{
	struct ct_key rk;
	ct_key_make(&rk, flow->addr, p->saddr, flow->port, p->sport, p->proto,
		    p->family, CT_REPLY);
	struct ct_val *back = bpf_map_lookup_elem(&svcproxy_ct, &rk);
	if (back)
		back->flags |= CT_XDP;
}

// The end of a decision the XDP program made (noinline: its own stack frame,
// apart from decide's): a connection to forward goes from XDP when
// xdp_route finds the way and its source is known (xdp_source), and is
// cached; all else goes to the stack. Only a packet whose checksum is whole
// comes here.
static __noinline int xdp_finish(struct xdp_md *ctx, const struct pkt *p,
				 const struct ct_val *flow, __u32 generation)
{
	struct xdp_fwd fwd;
	struct ct_key k;
	ct_key_of(&k, p);
	// A connection that goes the stack's way now is forgotten here (its
	// endpoint may be a new one: a port used again after a FIN). One the
	// kernel's conntrack masquerades stays the stack's.
	int masq = flow->flags & ROUTE_MASQUERADE;
	int fresh = masq && (flow->flags & CT_FRESH);
	int source = 0;
	if ((!masq || fresh || (flow->flags & CT_BPF_SNAT)) && !partial_csum(p) &&
	    xdp_route(ctx, p, flow, fresh, &fwd))
		source = xdp_source(p, flow, &k, &fwd);
	if (source <= 0) {
		bpf_map_delete_elem(&svcproxy_xdp_nat, &k);
		if (source < 0) {
			snat_lost(&k, p->family);
			return xdp_count(XDP_STAT_DROP, XDP_DROP);
		}
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	}
	if (flow->flags & CT_FRESH)
		xdp_fresh(p, flow);
	xdp_deltas(p, &fwd);
	fwd.generation = generation;
	fwd.jiffies = bpf_jiffies64();
	bpf_map_update_elem(&svcproxy_xdp_nat, &k, &fwd, BPF_ANY);
	return xdp_sent(xdp_send(ctx, p, &fwd));
}

// An endpoint's reply to a connection svcproxy masqueraded, arriving on an
// interface the XDP program runs on (another node's endpoint): sent on to the
// client from here as the tc programs would (addressed to the client again,
// from the service address), and cached as a connection's packets are. A FIN
// or RST, a partial checksum, or no way known goes to the stack's tc programs,
// which do the same. -1 when the packet is no such reply (noinline: its own
// stack frame).
static __noinline int xdp_snat_reply(struct xdp_md *ctx, const struct pkt *p, __u32 generation)
{
	__u32 zero = 0;
	struct snat_range *r = bpf_map_lookup_elem(&svcproxy_snat, &zero);
	__u16 port = bpf_ntohs(p->dport);
	if (!r || !r->hi || port < r->lo || port > r->hi)
		return -1;
	struct ct_key k;
	ct_key_of(&k, p);
	k.dir = CT_SNAT_REPLY;
	struct ct_val *e = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!e)
		return -1;
	if ((p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) || partial_csum(p))
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	// The client (its address and port, as a flow's endpoint for xdp_route),
	// then the service address it knows the connection by.
	struct ct_val client = *e;
	touch(e);
	if (!(e->flags & CT_REPLIED))
		e->flags |= CT_REPLIED;
	addr_copy(k.daddr, client.addr);
	k.dport = client.port;
	k.dir = CT_REPLY;
	struct ct_val *back = bpf_map_lookup_elem(&svcproxy_ct, &k);
	struct xdp_fwd fwd;
	if (!back || !xdp_route(ctx, p, &client, 0, &fwd))
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	addr_copy(fwd.saddr, back->addr);
	fwd.sport = back->port;
	// The client's side of the connection is touched, as the egress program
	// touches it for the replies it sees.
	struct ct_key ok;
	ct_key_make(&ok, client.addr, back->addr, client.port, back->port, p->proto,
		    p->family, CT_ORIGINAL);
	struct ct_val *orig = bpf_map_lookup_elem(&svcproxy_ct, &ok);
	if (orig)
		touch(orig);
	xdp_deltas(p, &fwd);
	fwd.generation = generation;
	fwd.jiffies = bpf_jiffies64();
	ct_key_of(&k, p);
	bpf_map_update_elem(&svcproxy_xdp_nat, &k, &fwd, BPF_ANY);
	return xdp_sent(xdp_send(ctx, p, &fwd));
}

// A connection's packet the XDP program sent on lately, the maps unchanged
// since, no longer than the way's MTU: sent on the same way (noinline: its
// key's stack is its own). -1 when there is none.
static __noinline int xdp_cached(struct xdp_md *ctx, const struct pkt *p, __u32 generation)
{
	struct ct_key k;
	ct_key_of(&k, p);
	struct xdp_fwd *f = bpf_map_lookup_elem(&svcproxy_xdp_nat, &k);
	if (!f || f->generation != generation || bpf_jiffies64() - f->jiffies >= FWD_FRESH_JIFFIES)
		return -1;
	__u32 l3_len = p->l4_len + (p->family == FAMILY_V4 ? sizeof(struct iphdr)
							   : sizeof(struct ipv6hdr));
	if (l3_len > f->mtu)
		return -1;
	return xdp_sent(xdp_send(ctx, p, f));
}

SEC("xdp")
int svcproxy_xdp(struct xdp_md *ctx)
{
	struct pkt p;
	struct config *cfg = config();
	if (!cfg || !parse_xdp(ctx, &p))
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	// The maps' generation before the decision: a write during it makes the
	// cache entry stale at once.
	__u32 generation = cfg->generation;
	int whole = !partial_csum(&p);
	if (whole && !(p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST))) {
		int action = xdp_cached(ctx, &p, generation);
		if (action >= 0)
			return action;
	}
	int action = xdp_snat_reply(ctx, &p, generation);
	if (action >= 0)
		return action;
	struct ct_val flow;
	switch (decide(ctx, &p, ctx->ingress_ifindex, &flow)) {
	case VERDICT_FORWARD:
		return xdp_finish(ctx, &p, &flow, generation);
	case VERDICT_DROP:
		return xdp_count(XDP_STAT_DROP, XDP_DROP);
	default:
		// A reject is tc's to mark (the fixed rule answers it).
		return xdp_count(XDP_STAT_PASS, XDP_PASS);
	}
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
