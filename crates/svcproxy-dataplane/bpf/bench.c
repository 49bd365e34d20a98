// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// XDP programs for the XDP benchmark and tests (crates/svcproxy-e2e), never
// loaded by svcproxy itself:
// - bench_gen, run by BPF_PROG_RUN in live-frames mode: writes the frame
//   template of bench_cfg (one IPv4 UDP datagram), gives it one of `flows`
//   source ports in turn, and sends it out of `out` (a veth, whose peer is the
//   interface under test);
// - bench_floor: the floor a translating XDP program is held to: rewrites the
//   destination to bench_cfg's address and port and redirects to `out`, with no
//   lookup at all;
// - bench_pass: lets every packet go on to the stack (a veth peer needs an XDP
//   program, or GRO, to take redirected frames);
// - bench_sink: counts packets (bench_count) and drops them.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TEMPLATE_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr))

struct bench_cfg {
	__u8 template[TEMPLATE_LEN];
	__u8 pad[2];
	__u32 out;    // the interface frames are sent out of
	__u32 flows;  // bench_gen: source ports in turn, from the template's
	__u32 daddr;  // bench_floor: the endpoint's address and port
	__u16 dport;
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__u8 pad2[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bench_cfg);
} bench_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} bench_count SEC(".maps");

static __always_inline struct bench_cfg *cfg(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&bench_cfg, &zero);
}

SEC("xdp")
int bench_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct bench_cfg *c = cfg();
	if (!c || data + TEMPLATE_LEN > end)
		return XDP_ABORTED;
	__builtin_memcpy(data, c->template, TEMPLATE_LEN);
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&bench_count, &zero);
	if (!n)
		return XDP_ABORTED;
	__u32 flow = c->flows ? *n % c->flows : 0;
	*n += 1;
	struct udphdr *uh = data + sizeof(struct ethhdr) + sizeof(struct iphdr);
	uh->source = bpf_htons(bpf_ntohs(uh->source) + flow);
	return bpf_redirect(c->out, 0);
}

SEC("xdp")
int bench_floor(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *uh = (void *)(ip + 1);
	if ((void *)(uh + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	struct bench_cfg *c = cfg();
	if (!c)
		return XDP_PASS;
	__u32 old = ip->daddr, new = c->daddr;
	__u32 sum = bpf_csum_diff(&old, 4, &new, 4, (__u16)~ip->check);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip->check = (__u16)~sum;
	ip->daddr = new;
	// The TTL, as any forwarding lowers it.
	__u32 check = (__u32)ip->check + (__u32)bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xffff));
	ip->ttl--;
	uh->dest = c->dport;
	__builtin_memcpy(eth->h_dest, c->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, c->smac, ETH_ALEN);
	return bpf_redirect(c->out, 0);
}

SEC("xdp")
int bench_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp")
int bench_sink(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&bench_count, &zero);
	if (n)
		*n += 1;
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
