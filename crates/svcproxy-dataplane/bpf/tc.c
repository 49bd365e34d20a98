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
//
// Their steps are in lib/ by concern: the packet (pkt.h), the connection table
// (ct.h), the decision for a packet from outside (decide.h), svcproxy's own
// masquerade (nat.h), ICMP errors (icmp.h).

#include "lib/pkt.h"
#include "lib/ct.h"
#include "lib/decide.h"
#include "lib/nat.h"
#include "lib/icmp.h"

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
