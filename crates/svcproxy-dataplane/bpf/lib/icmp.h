// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// ICMP errors about a packet of a connection translated here, translated as
// that connection's packets are (icmp_error, on tc ingress and egress), with
// the checksums that cover what they quote (csum_update, icmp_translate).

#ifndef SVCPROXY_LIB_ICMP_H
#define SVCPROXY_LIB_ICMP_H

#include "ct.h"
#include "nat.h"
#include "pkt.h"

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

#endif
