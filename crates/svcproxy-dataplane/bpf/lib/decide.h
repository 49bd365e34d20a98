// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The packet path's decision (decide), which the tc ingress program and the
// XDP program share, and what it asks: whether a packet comes from this node's
// pods (from_pod), whether it answers one of the node's own sockets
// (answers_local_socket), and a new connection's endpoint, as its route's
// scheduler chooses from the packet (sched_hash, choose), marked where its
// translated tuple's reply entry names another service address (the tc
// ingress program then remaps its client port: tc.c, remap_new).

#ifndef SVCPROXY_LIB_DECIDE_H
#define SVCPROXY_LIB_DECIDE_H

#include "ct.h"
#include "pkt.h"
#include "sched.h"
#include "service.h"

// svcproxy_ifc's flags: packets arriving here come from this node's pods.
#define IFC_PODS 1

// A SYN again within this time of the choice is a retransmission of the same
// connection (Linux retries at 1, 3, 7, 15, 31 s): it keeps the endpoint chosen
// for the first. A new connection from the same client port comes only after
// the old one's TIME_WAIT (60 s).
#define SYN_RETRY_NS (60ULL * 1000000000ULL)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, __u32);
} svcproxy_ifc SEC(".maps");

struct aff_ip_key {
	__u64 affinity_id;
	__u32 client[4]; // the client's address
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct aff_ip_key);
	__type(value, struct aff_val);
} svcproxy_affip SEC(".maps");

// The packet comes from one of this node's pods (the intent's local_traffic:
// its interface, or its source among the pods' CIDRs).
static __always_inline int from_pod(__u32 ifindex, const struct pkt *p)
{
	__u32 *flags = bpf_map_lookup_elem(&svcproxy_ifc, &ifindex);
	if (flags && (*flags & IFC_PODS))
		return 1;
	return pod_source(p->family, p->saddr);
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

	// The reply entry first (no reply comes before the packet goes on), so
	// that its key and the original's share the stack. The translated tuple's
	// reply entry another connection's (another service address, or a remapped
	// connection's): the tc ingress program decides whether the client port is
	// remapped (tc.c, remap_new), and makes this connection's reply entry.
	struct ct_key rk;
	ct_key_make(&rk, be.addr, p->saddr, be.port, p->sport, p->proto,
		    p->family, CT_REPLY);
	struct ct_val rv = {};
	addr_copy(rv.addr, p->daddr);
	rv.port = p->dport;
	rv.created_ns = out->created_ns;
	// Made only where none is (two first packets on two CPUs cannot both take
	// the tuple); one there already is this connection's old one (the same
	// client port to the same service address, not remapped), or another's.
	if (bpf_map_update_elem(&svcproxy_ct, &rk, &rv, BPF_NOEXIST)) {
		struct ct_val *held = bpf_map_lookup_elem(&svcproxy_ct, &rk);
		if (held && (!(held->port == p->dport && addr_eq(held->addr, p->daddr)) ||
			     (held->flags & CT_REMAPPED)))
			out->flags |= CT_REMAP_WANTED;
		else
			bpf_map_update_elem(&svcproxy_ct, &rk, &rv, BPF_ANY);
	}
	struct ct_key k;
	ct_key_of(&k, p);
	bpf_map_update_elem(&svcproxy_ct, &k, out, BPF_ANY);
	return 1;
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

// Over 80 lines: one packet's whole decision (a known connection kept, closed or
// forgotten idle; for a new one the service, the guard, the route, the fence and
// the endpoint), its branches sharing the entry found. Kept in one piece: it is
// a subprogram of its own (noinline), and a cut would change what the verifier
// sees.
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

#endif
