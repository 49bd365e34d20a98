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

// Client ports remapped where two connections would be one tuple at their
// endpoint (one client port, two service addresses, one endpoint): choose
// (decide.h) marks a new connection whose translated tuple's reply entry names
// another service address (CT_REMAP_WANTED), and remap_new, here, decides.

// New connections whose translated tuple another connection held: given another
// client port (REMAP_STAT_REMAPPED), or left to share the tuple for want of a
// range or a free port (REMAP_STAT_SHARED), per CPU.
#define REMAP_STAT_REMAPPED 0
#define REMAP_STAT_SHARED 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u64);
} svcproxy_remap_stats SEC(".maps");

static __always_inline void remap_count(__u32 stat)
{
	count_in(&svcproxy_remap_stats, stat);
}

// How long an endpoint is taken to hold a connection's tuple after its last
// packet, when nothing says it is still open: TIME_WAIT's 60 s, with the
// margin conntrack gives it (its TIME_WAIT lasts 120 s).
#define REMAP_HELD_S 120
// Ports tried at random for a remapped client port.
#define REMAP_TRIES 16

// Whether the reply entry `e` under `rk` (endpoint to client, the client's
// port as the endpoint sees it) is a connection's still: its original entry
// (client to service address; through svcproxy_remap for a remapped one) open
// (TCP: no FIN or RST passed, not idle past its timeout), or its last packet
// either way within REMAP_HELD_S (a closed TCP connection's TIME_WAIT; a UDP
// flow's conntrack timeout). The endpoint would take a new connection's
// packets on that tuple for that one's: a SYN meeting an open or TIME_WAIT
// socket is answered with that connection's ACK.
static __always_inline int reply_in_use(const struct ct_key *rk, const struct ct_val *e)
{
	__u32 last = e->seen_s;
	__u32 born = e->created_ns / 1000000000ULL;
	if (born > last)
		last = born;
	__u16 client_port = rk->dport;
	if (e->flags & CT_REMAPPED) {
		struct remap_val *r = bpf_map_lookup_elem(&svcproxy_remap, rk);
		if (r)
			client_port = r->port;
	}
	struct ct_key ok;
	ct_key_make(&ok, rk->daddr, e->addr, client_port, e->port, rk->proto, rk->family,
		    CT_ORIGINAL);
	struct ct_val *o = bpf_map_lookup_elem(&svcproxy_ct, &ok);
	if (o) {
		if (o->seen_s > last)
			last = o->seen_s;
		if (rk->proto == IPPROTO_TCP && !(o->flags & CT_CLOSING) && !idle_expired(o, 1))
			return 1;
	}
	return now_s() - last <= REMAP_HELD_S;
}

struct remap_try {
	struct ct_key rk; // endpoint -> client, the port tried
	struct ct_val v;  // the service address (the reply entry)
	__u16 lo;
	__u16 span;
	__u16 port; // network order; 0 while none is found
	__u16 pad;
};

// One client port tried: its reply entry made, unless another connection has
// it still (reply_in_use; one over gives it up). 1 when taken.
static __always_inline int remap_step(struct remap_try *t)
{
	__u16 port = bpf_htons(t->lo + bpf_get_prandom_u32() % t->span);
	t->rk.dport = port;
	if (!bpf_map_update_elem(&svcproxy_ct, &t->rk, &t->v, BPF_NOEXIST)) {
		t->port = port;
		return 1;
	}
	struct ct_val *e = bpf_map_lookup_elem(&svcproxy_ct, &t->rk);
	if (!e || reply_in_use(&t->rk, e))
		return 0;
	if (bpf_map_update_elem(&svcproxy_ct, &t->rk, &t->v, BPF_EXIST))
		return 0;
	t->port = port;
	return 1;
}

// A new connection whose translated tuple's reply entry is another
// connection's (CT_REMAP_WANTED, from choose; `p` before translation, `flow` its
// endpoint): if that connection is still in use (reply_in_use), its
// client port is remapped to a port of svcproxy_snat's range (above the node's
// ip_local_port_range, which the kernel's masquerade leaves alone), its reply
// entry made under that port and both ports remembered (svcproxy_remap); else,
// or when svcproxy has no such range or no port was free, its reply entry is
// made as for any new connection (it then shares the tuple, as before). 0 when
// the packet cannot go (its connection was forgotten meanwhile). noinline, with
// one frame for all: decide's is full.
static __noinline int remap_new(const struct pkt *p, struct ct_val *flow)
{
	struct ct_key k;
	ct_key_of(&k, p);
	struct ct_val *orig = bpf_map_lookup_elem(&svcproxy_ct, &k);
	if (!orig)
		return 0;
	struct remap_try t;
	__builtin_memset(&t, 0, sizeof(t));
	ct_key_make(&t.rk, flow->addr, p->saddr, flow->port, p->sport, p->proto, p->family,
		    CT_REPLY);
	addr_copy(t.v.addr, p->daddr);
	t.v.port = p->dport;
	t.v.created_ns = flow->created_ns;
	__u8 flags = flow->flags & ~CT_REMAP_WANTED;
	__u32 zero = 0;
	struct snat_range *r = bpf_map_lookup_elem(&svcproxy_snat, &zero);
	struct ct_val *held = bpf_map_lookup_elem(&svcproxy_ct, &t.rk);
	int wanted = held && reply_in_use(&t.rk, held);
	if (wanted && r && r->hi && r->hi >= r->lo) {
		t.v.flags = CT_REMAPPED;
		t.lo = r->lo;
		t.span = r->hi - r->lo + 1;
		// A plain bounded loop: a bpf_loop callback's frame would add to this
		// one's, past the 512 bytes a call chain may take.
		for (int i = 0; i < REMAP_TRIES; i++)
			if (remap_step(&t))
				break;
	}
	if (t.port) {
		struct remap_val v = { .port = t.port };
		if (bpf_map_update_elem(&svcproxy_remap, &k, &v, BPF_ANY))
			t.port = 0;
		v.port = p->sport;
		if (t.port && bpf_map_update_elem(&svcproxy_remap, &t.rk, &v, BPF_ANY))
			t.port = 0;
		if (!t.port)
			bpf_map_delete_elem(&svcproxy_ct, &t.rk);
	}
	if (wanted)
		remap_count(t.port ? REMAP_STAT_REMAPPED : REMAP_STAT_SHARED);
	if (t.port) {
		flags |= CT_REMAPPED;
	} else {
		t.rk.dport = p->sport;
		t.v.flags = 0;
		bpf_map_update_elem(&svcproxy_ct, &t.rk, &t.v, BPF_ANY);
	}
	orig->flags = (orig->flags & ~CT_REMAP_WANTED) | (flags & CT_REMAPPED);
	flow->flags = flags;
	return 1;
}

// A packet of a connection whose client port is remapped (remap):
// its source port toward the endpoint. 0 when the remap is forgotten (the
// packet is then dropped, not sent as the other connection's).
static __noinline int remap_out(struct __sk_buff *skb, const struct pkt *p)
{
	struct ct_key k;
	ct_key_of(&k, p);
	struct remap_val *r = bpf_map_lookup_elem(&svcproxy_remap, &k);
	return r && rewrite_port(skb, p, 0, r->port);
}

// A retransmitted SYN of a connection whose reply entry went: made again. A
// full map's LRU may take an entry made moments before (a CPU short of free
// entries takes them from another's newest), and without it the endpoint's
// SYN-ACK leaves untranslated, for this SYN and every retransmission after it
// (the original entry, still there, keeps them on this path).
static __noinline int keep_reply(const struct pkt *p, const struct ct_val *flow)
{
	struct ct_key rk;
	ct_key_make(&rk, flow->addr, p->saddr, flow->port, p->sport, p->proto, p->family,
		    CT_REPLY);
	if (bpf_map_lookup_elem(&svcproxy_ct, &rk))
		return 0;
	struct ct_val rv = {};
	addr_copy(rv.addr, p->daddr);
	rv.port = p->dport;
	rv.created_ns = flow->created_ns;
	bpf_map_update_elem(&svcproxy_ct, &rk, &rv, BPF_NOEXIST);
	return 1;
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
	if ((flow.flags & CT_REMAP_WANTED) && !remap_new(&p, &flow))
		return TC_ACT_SHOT;
	if (p.proto == IPPROTO_TCP &&
	    (p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN &&
	    !(flow.flags & (CT_FRESH | CT_REMAPPED | CT_BPF_SNAT)))
		keep_reply(&p, &flow);
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
	if ((flow.flags & CT_REMAPPED) && !remap_out(skb, &p))
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
	// A remapped connection's replies go back to the client's own port.
	__u16 client_port = p->dport;
	if (back.flags & CT_REMAPPED) {
		struct remap_val *r = bpf_map_lookup_elem(&svcproxy_remap, &k);
		if (!r)
			return TC_ACT_SHOT;
		client_port = r->port;
	}
	int closing = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST));
	// A reply keeps its connection from idling out: the client's side of it (its
	// original entry) is touched at most once a second, and told of a FIN or
	// RST, which the lc scheduler's count is given back at.
	__u32 now = now_s();
	if (closing || ct->seen_s != now) {
		ct->seen_s = now;
		struct ct_key ok;
		ct_key_make(&ok, p->daddr, back.addr, client_port, back.port, p->proto,
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
	if (!rewrite(skb, p, 0, back.addr, back.port) || !rewrite_port(skb, p, 1, client_port))
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
