// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The XDP fast path (--ebpf-xdp=native): on the node's interfaces from
// outside whose driver runs XDP, a connection's packets that need nothing of
// the kernel (no masquerade, no reject, no fragment, no IP option) are
// translated and sent on to the endpoint's interface here, before the kernel
// builds a socket buffer; drops are made here too. Everything else goes on
// untranslated (XDP_PASS) to the tc program, which finds what was decided
// here and finishes it. Only interfaces svcproxy found able to take frames
// redirected to them (their kernel XDP features: a veth whose peer runs NAPI,
// a driver with ndo_xdp_xmit) are sent to: others meet the stack as before.
//
// It shares the tc ingress program's decision (lib/decide.h) and svcproxy's own
// masquerade (lib/nat.h); its maps are in lib/xdp_maps.h, and what it alone
// does is here.

#include "lib/pkt.h"
#include "lib/ct.h"
#include "lib/decide.h"
#include "lib/nat.h"
#include "lib/xdp_maps.h"

static __always_inline int xdp_count(__u32 stat, int action)
{
	count_in(&svcproxy_xdp_stats, stat);
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

// svcproxy's own masquerade (lib/nat.h), the XDP program's part: a port of
// svcproxy_snat's range for a new connection (only the XDP program takes one).

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
	// A connection whose client port is remapped is the tc programs' (they
	// give it the port both ways).
	int remapped = flow->flags & (CT_REMAPPED | CT_REMAP_WANTED);
	if (!remapped && (!masq || fresh || (flow->flags & CT_BPF_SNAT)) && !partial_csum(p) &&
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
