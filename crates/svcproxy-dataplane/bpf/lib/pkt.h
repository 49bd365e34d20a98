// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// A packet as the packet programs see it (struct pkt): a socket buffer's
// headers parsed (parse), and its addresses and ports rewritten with the
// checksums that cover them (rewrite). The XDP program parses and rewrites a
// frame its own way (parse_xdp, xdp_send in xdp.c).

#ifndef SVCPROXY_LIB_PKT_H
#define SVCPROXY_LIB_PKT_H

#include "common.h"
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

// The packet's source port (dst 0) or destination port (dst 1) rewritten, with
// the checksum that covers it; its addresses left as they are.
static __always_inline int rewrite_port(struct __sk_buff *skb, const struct pkt *p, int dst,
					__u16 port)
{
	__u16 old_port = dst ? p->dport : p->sport;
	if (port == old_port)
		return 1;
	if (bpf_l4_csum_replace(skb, p->csum_off, old_port, port, sizeof(__u16) | p->csum_flags))
		return 0;
	__u32 port_off = p->l4_off +
			 (dst ? offsetof(struct udphdr, dest) : offsetof(struct udphdr, source));
	return !bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0);
}

#endif
