// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// svcproxy's socket-level load balancing: cgroup programs that translate a
// connection to a service address once, when the socket names it (connect(),
// sendmsg()), and show the service address back to the application (recvmsg(),
// getpeername()).
//
// The programs decide nothing: every verdict, endpoint list and affinity timeout
// is written into the maps by svcproxy from its intent (see
// crates/svcproxy-dataplane/src/ebpf/). They only look up, pick (as the route's
// scheduler says, or the client's remembered endpoint) and rewrite. The maps'
// layouts are in lib/maps.h and lib/sched.h (this file's own maps' below),
// mirrored by src/ebpf/wire.rs.

#include "lib/common.h"
#include "lib/maps.h"
#include "lib/sched.h"
#include "lib/service.h"
#include <bpf/bpf_endian.h>

#define ECONNREFUSED 111
#define ETIMEDOUT 110
#define SOL_SOCKET 1
#define SOCK_STREAM 1
#define SO_MARK 36
#define IPPROTO_UDP 17

// A socket's translated peer: the endpoint it was sent to, by socket cookie.
struct rev_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct rev_val {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

// A connected socket's service address and endpoint, in the socket's own
// storage (freed with it, never evicted).
struct sock_peer {
	__u32 vip[4];
	__u16 vport;
	__u8 family; // the endpoint's (FAMILY_*)
	__u8 counted; // the connection counts in svcproxy_conns until released
	__u32 be[4];
	__u16 beport;
	__u16 pad2;
};

// A connected UDP socket's translation (its svcproxy_peer storage, copied), by
// socket cookie: svcproxy finds here the sockets to destroy when their endpoint
// leaves (sock_diag lists a UDP socket's cookie, not its storage).
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u64);
	__type(value, struct sock_peer);
} svcproxy_udpsock SEC(".maps");

// An unconnected UDP socket's flow to one service address, so its datagrams
// stay with one endpoint as conntrack keeps a flow.
struct flow_key {
	__u64 cookie;
	struct svc_key svc;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct rev_key);
	__type(value, struct rev_val);
} svcproxy_rev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, int);
	__type(value, struct sock_peer);
} svcproxy_peer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct flow_key);
	__type(value, struct backend);
} svcproxy_flow SEC(".maps");

// An IPv6 socket names an IPv4 address as ::ffff:a.b.c.d (IPv4-mapped): the
// maps key it as the IPv4 address it is.
static __always_inline int v4_mapped(const __u32 *ip6)
{
	return ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0xffff);
}

// The address ctx names, as the maps key it; returns its family (IPv4 for an
// IPv6 socket naming an IPv4-mapped address).
static __always_inline int read_dst(struct bpf_sock_addr *ctx, int family, __u32 *addr)
{
	if (family == FAMILY_V4) {
		addr[0] = ctx->user_ip4;
		return FAMILY_V4;
	}
	addr[0] = ctx->user_ip6[0];
	addr[1] = ctx->user_ip6[1];
	addr[2] = ctx->user_ip6[2];
	addr[3] = ctx->user_ip6[3];
	if (!v4_mapped(addr))
		return FAMILY_V6;
	addr[0] = addr[3];
	addr[1] = 0;
	addr[2] = 0;
	addr[3] = 0;
	return FAMILY_V4;
}

// Writes addr (of family `as`, the maps' form) into ctx, an IPv4 address into
// an IPv6 socket's call as ::ffff:a.b.c.d.
static __always_inline void write_dst(struct bpf_sock_addr *ctx, int family, int as,
				      const __u32 *addr, __u16 port)
{
	if (family == FAMILY_V4) {
		ctx->user_ip4 = addr[0];
	} else if (as == FAMILY_V4) {
		ctx->user_ip6[0] = 0;
		ctx->user_ip6[1] = 0;
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = addr[0];
	} else {
		ctx->user_ip6[0] = addr[0];
		ctx->user_ip6[1] = addr[1];
		ctx->user_ip6[2] = addr[2];
		ctx->user_ip6[3] = addr[3];
	}
	ctx->user_port = port;
}

static __always_inline struct svc_val *lookup_service(struct bpf_sock_addr *ctx, int family,
						      struct svc_key *key)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->family = read_dst(ctx, family, key->addr);
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
	return find_service(key);
}

// The socket's bound source address, if it has one (0: none, the kernel
// chooses at connect), in the maps' form: an IPv6 socket's IPv4-mapped source
// as its IPv4 address.
static __always_inline int bound_source(struct bpf_sock_addr *ctx, int family, __u32 *src)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	if (family == FAMILY_V4) {
		src[0] = sk->src_ip4;
	} else {
		src[0] = sk->src_ip6[0];
		src[1] = sk->src_ip6[1];
		src[2] = sk->src_ip6[2];
		src[3] = sk->src_ip6[3];
		if (v4_mapped(src)) {
			src[0] = src[3];
			src[3] = 0;
			src[2] = 0;
		}
	}
	return (src[0] | src[1] | src[2] | src[3]) != 0;
}

// `addr` (of `family`, the maps' form) is a loopback address.
static __always_inline int loopback(__u8 family, const __u32 *addr)
{
	if (family == FAMILY_V4)
		return (bpf_ntohl(addr[0]) >> 24) == 127;
	return !addr[0] && !addr[1] && !addr[2] && addr[3] == bpf_htonl(1);
}

// The hashing schedulers' input for a connection: the client (sh: its network
// namespace, a pod's, or the source a host's stream socket bound), the service
// address (dh), the socket (mh: a flow, whose source port is not chosen yet).
static __always_inline __u32 sched_hash(struct bpf_sock_addr *ctx, const struct route *rt,
					const struct svc_key *key, __u64 netns, int host_stream,
					int family)
{
	switch (rt->sched) {
	case SCHED_SH: {
		__u32 src[4] = {};
		if (host_stream && bound_source(ctx, family, src))
			return hash_addr(0, src);
		return hash_u64(0, netns);
	}
	case SCHED_DH:
		return hash_addr(0, key->addr);
	case SCHED_MH:
		return hash_u64(hash_u64(0, netns), bpf_get_socket_cookie(ctx));
	default:
		return 0;
	}
}

// Gives back the live connection a stream socket counts for its endpoint (lc).
static __always_inline void release_count(struct sock_peer *p)
{
	if (!p->counted)
		return;
	p->counted = 0;
	count_release(&svcproxy_conns, p->be, p->beport, p->family);
}

// Adds `mark` to the socket's own (SO_MARK), for the companion rules.
static __always_inline void mark_socket(struct bpf_sock_addr *ctx, __u32 mark)
{
	int cur = 0;
	if (bpf_getsockopt(ctx, SOL_SOCKET, SO_MARK, &cur, sizeof(cur)))
		cur = 0;
	cur |= mark;
	bpf_setsockopt(ctx, SOL_SOCKET, SO_MARK, &cur, sizeof(cur));
}

// 1: the socket call goes on (translated or not); 0: it fails with the error
// set here.
static __always_inline int refuse(int err)
{
	bpf_set_retval(-err);
	return 0;
}

// A connected socket that is not translated (again) must not show a service
// address it was translated to earlier.
static __always_inline void forget_peer(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct sock_peer *p = sk ? bpf_sk_storage_get(&svcproxy_peer, sk, 0, 0) : 0;
	if (p) {
		release_count(p);
		p->beport = 0;
		if (ctx->protocol == IPPROTO_UDP) {
			__u64 cookie = bpf_get_socket_cookie(ctx);
			bpf_map_delete_elem(&svcproxy_udpsock, &cookie);
		}
	}
}

// Translates the destination of ctx to an endpoint. `datagram`: an unconnected
// socket's sendmsg (its flow keeps one endpoint per service address).
// Over 80 lines: one socket call's translation from the lookup to the rewrite,
// each step using what the earlier ones found (the service, the route of the
// call's origin, the endpoint, the socket's cookie); kept in one piece, as the
// verifier has always seen it.
static __always_inline int translate(struct bpf_sock_addr *ctx, int family, int datagram)
{
	struct svc_key key;
	struct svc_val *svc = lookup_service(ctx, family, &key);
	if (!svc) {
		struct config *c = config();
		// The guard is the host's to apply; pods left to the packet path meet
		// it there.
		if (!(c && c->host_only && bpf_get_netns_cookie(ctx) != c->host_netns_cookie)) {
			switch (guard(&key)) {
			case GUARD_REJECT:
				return refuse(ECONNREFUSED);
			case GUARD_DROP:
				return refuse(ETIMEDOUT);
			}
		}
		if (!datagram)
			forget_peer(ctx);
		return 1;
	}

	struct config *cfg = config();
	__u64 netns = bpf_get_netns_cookie(ctx);
	int from_host = cfg && netns == cfg->host_netns_cookie;
	if (cfg && cfg->host_only && !from_host)
		return 1;
	struct route *rt = from_host ? &svc->host : &svc->pod;

	// A host socket bound to a source address before connecting: that source
	// is known, so it meets loadBalancerSourceRanges as its packets would, and
	// the connection is masqueraded where the packet modes masquerade the
	// node's packets from that source (the route's flags: the intent's), and
	// always from a loopback address, which no endpoint elsewhere can answer.
	// Not for an unconnected UDP socket's datagrams: its mark would stay on
	// every later datagram, to any destination.
	int bound_masquerade = 0;
	if (from_host && !datagram && rt->action == ACT_FORWARD && cfg) {
		__u32 src[4] = {};
		if (bound_source(ctx, family, src)) {
			if (svc->fw_id && !admitted(svc, key.family, src))
				return refuse(ETIMEDOUT);
			bound_masquerade = (rt->flags & ROUTE_MASQUERADE) || loopback(key.family, src) ||
					   ((rt->flags & ROUTE_MASQUERADE_UNLESS_POD) &&
					    !pod_source(key.family, src));
		}
	}

	switch (rt->action) {
	case ACT_FORWARD:
		break;
	case ACT_DROP:
		return refuse(ETIMEDOUT);
	case ACT_PASS:
		if (!datagram)
			forget_peer(ctx);
		return 1;
	default:
		return refuse(ECONNREFUSED);
	}
	__u32 list = rt->list, count = rt->count;
	if (count == 0)
		return refuse(ECONNREFUSED);

	__u64 cookie = datagram ? bpf_get_socket_cookie(ctx) : 0;
	struct flow_key fk = {};
	// Where the endpoint is found (a map's value), copied once below.
	const struct backend *found = 0;

	if (datagram) {
		fk.cookie = cookie;
		fk.svc = key;
		struct backend *prev = bpf_map_lookup_elem(&svcproxy_flow, &fk);
		if (prev && is_member(list, prev))
			found = prev;
	}

	struct aff_key ak = {};
	if (!found && svc->affinity_secs) {
		ak.affinity_id = svc->affinity_id;
		ak.client = netns;
		struct aff_val *av = bpf_map_lookup_elem(&svcproxy_aff, &ak);
		__u64 now = bpf_ktime_get_ns();
		if (av && now - av->last_ns <= (__u64)svc->affinity_secs * 1000000000ULL &&
		    is_member(list, &av->be))
			found = &av->be;
	}

	if (!found)
		found = pick(rt, sched_hash(ctx, rt, &key, netns, from_host && !datagram, family));
	// The list being replaced under us: leave the call alone rather than guess.
	if (!found)
		return 1;
	struct backend chosen;
	__builtin_memcpy(&chosen, found, sizeof(chosen));

	if (svc->affinity_secs) {
		ak.affinity_id = svc->affinity_id;
		ak.client = netns;
		// Zeroed first: the padding must not be uninitialised stack.
		struct aff_val nv;
		__builtin_memset(&nv, 0, sizeof(nv));
		nv.be = chosen;
		nv.last_ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&svcproxy_aff, &ak, &nv, BPF_ANY);
	}
	if (datagram)
		bpf_map_update_elem(&svcproxy_flow, &fk, &chosen, BPF_ANY);

	if (datagram) {
		// One socket, many peers: by cookie and endpoint.
		struct rev_key rk = {};
		rk.cookie = cookie;
		rk.addr[0] = chosen.addr[0];
		rk.addr[1] = chosen.addr[1];
		rk.addr[2] = chosen.addr[2];
		rk.addr[3] = chosen.addr[3];
		rk.port = chosen.port;
		struct rev_val rv = {};
		rv.addr[0] = key.addr[0];
		rv.addr[1] = key.addr[1];
		rv.addr[2] = key.addr[2];
		rv.addr[3] = key.addr[3];
		rv.port = key.port;
		bpf_map_update_elem(&svcproxy_rev, &rk, &rv, BPF_ANY);
	} else {
		struct bpf_sock *sk = ctx->sk;
		struct sock_peer *p = sk ? bpf_sk_storage_get(&svcproxy_peer, sk, 0,
							    BPF_SK_STORAGE_GET_F_CREATE)
					 : 0;
		if (p) {
			// A socket connecting again gives back its last connection's count.
			release_count(p);
			// Connections, not connected datagram sockets, count.
			if (COUNTS_CONNS(rt->sched) && ctx->type == SOCK_STREAM) {
				count_add(&svcproxy_conns, &chosen, 1);
				p->counted = 1;
			}
			p->family = chosen.family;
			p->vip[0] = key.addr[0];
			p->vip[1] = key.addr[1];
			p->vip[2] = key.addr[2];
			p->vip[3] = key.addr[3];
			p->vport = key.port;
			p->be[0] = chosen.addr[0];
			p->be[1] = chosen.addr[1];
			p->be[2] = chosen.addr[2];
			p->be[3] = chosen.addr[3];
			p->beport = chosen.port;
			if (ctx->protocol == IPPROTO_UDP) {
				__u64 sc = bpf_get_socket_cookie(ctx);
				bpf_map_update_elem(&svcproxy_udpsock, &sc, p, BPF_ANY);
			}
		}
	}

	if (bound_masquerade)
		mark_socket(ctx, cfg->masquerade_mark);
	write_dst(ctx, family, key.family, chosen.addr, chosen.port);
	return 1;
}

// Shows the service address instead of the endpoint's (recvmsg's source,
// getpeername's peer).
static __always_inline int reverse(struct bpf_sock_addr *ctx, int family)
{
	__u32 addr[4] = {};
	int as = read_dst(ctx, family, addr);
	__u16 port = (__u16)ctx->user_port;
	struct bpf_sock *sk = ctx->sk;
	struct sock_peer *p = sk ? bpf_sk_storage_get(&svcproxy_peer, sk, 0, 0) : 0;
	if (p && p->beport == port && p->be[0] == addr[0] && p->be[1] == addr[1] &&
	    p->be[2] == addr[2] && p->be[3] == addr[3]) {
		write_dst(ctx, family, as, p->vip, p->vport);
		return 1;
	}
	struct rev_key rk = {};
	rk.cookie = bpf_get_socket_cookie(ctx);
	rk.addr[0] = addr[0];
	rk.addr[1] = addr[1];
	rk.addr[2] = addr[2];
	rk.addr[3] = addr[3];
	rk.port = port;
	struct rev_val *rv = bpf_map_lookup_elem(&svcproxy_rev, &rk);
	if (rv)
		write_dst(ctx, family, as, rv->addr, rv->port);
	return 1;
}

SEC("cgroup/connect4")
int svcproxy_connect4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V4, 0);
}

SEC("cgroup/connect6")
int svcproxy_connect6(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V6, 0);
}

SEC("cgroup/sendmsg4")
int svcproxy_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V4, 1);
}

SEC("cgroup/sendmsg6")
int svcproxy_sendmsg6(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V6, 1);
}

SEC("cgroup/recvmsg4")
int svcproxy_recvmsg4(struct bpf_sock_addr *ctx)
{
	return reverse(ctx, FAMILY_V4);
}

SEC("cgroup/recvmsg6")
int svcproxy_recvmsg6(struct bpf_sock_addr *ctx)
{
	return reverse(ctx, FAMILY_V6);
}

SEC("cgroup/getpeername4")
int svcproxy_getpeername4(struct bpf_sock_addr *ctx)
{
	return reverse(ctx, FAMILY_V4);
}

SEC("cgroup/getpeername6")
int svcproxy_getpeername6(struct bpf_sock_addr *ctx)
{
	return reverse(ctx, FAMILY_V6);
}

// A socket is released (closed, or its process gone): its connection no longer
// counts for its endpoint.
SEC("cgroup/sock_release")
int svcproxy_release(struct bpf_sock *sk)
{
	struct sock_peer *p = bpf_sk_storage_get(&svcproxy_peer, sk, 0, 0);
	if (p) {
		release_count(p);
		if (sk->protocol == IPPROTO_UDP) {
			__u64 cookie = bpf_get_socket_cookie(sk);
			bpf_map_delete_elem(&svcproxy_udpsock, &cookie);
		}
	}
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
