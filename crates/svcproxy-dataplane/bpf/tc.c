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
// (ct.h), the decision for a packet from outside (decide.h, which the XDP
// program of xdp.c shares), svcproxy's own masquerade (nat.h), ICMP errors
// (icmp.h).

#include "lib/pkt.h"
#include "lib/ct.h"
#include "lib/decide.h"
#include "lib/nat.h"
#include "lib/icmp.h"
// The XDP program's maps, which the tc programs do not use (see xdp_maps.h).
#include "lib/xdp_maps.h"

// svcproxy's own masquerade (lib/nat.h), the tc programs' part: an endpoint's
// replies turned back to the client, and its connections' packets that meet
// the tc programs on their way to the endpoint.

// snat_reply's answer for a packet that is no such reply (TC_ACT_UNSPEC is -1).
#define NOT_SNAT_REPLY -2

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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
