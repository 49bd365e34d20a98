// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// svcproxy's socket-level load balancing: cgroup programs that translate a
// connection to a service address once, when the socket names it (connect(),
// sendmsg()), and show the service address back to the application (recvmsg(),
// getpeername()).
//
// The programs decide nothing: every verdict, endpoint list and affinity timeout
// is written into the maps by svcproxy from its intent (see
// crates/svcproxy-dataplane/src/ebpf/). They only look up, pick at random (or
// the client's remembered endpoint) and rewrite. The layouts below are mirrored
// by src/ebpf/wire.rs; change both together.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define ECONNREFUSED 111
#define ETIMEDOUT 110

// A route's action (wire.rs: Action).
#define ACT_FORWARD 0
#define ACT_DROP 1
#define ACT_REJECT 2
#define ACT_PASS 3

#define FAMILY_V4 4
#define FAMILY_V6 6

// A service address: a VIP (cluster, external or load-balancer IP), a node
// address with a NodePort, or (addr all zero) a NodePort on every local address.
struct svc_key {
	__u32 addr[4];
	__u16 port; // network order
	__u8 proto; // IPPROTO_*
	__u8 family;
};

// What a connection from one origin meets.
struct route {
	__u32 list;  // endpoint list id (slots and members maps)
	__u32 count; // endpoints in the list
	__u8 action;
	__u8 pad[3];
};

struct svc_val {
	struct route pod;  // from a process in any other network namespace
	struct route host; // from a process in the host's network namespace
	__u64 affinity_id; // the service port, for its affinity entries
	__u32 affinity_secs; // 0: no session affinity
	__u32 pad;
};

struct slot_key {
	__u32 list;
	__u32 slot;
};

struct backend {
	__u32 addr[4];
	__u16 port; // network order
	__u8 family;
	__u8 pad;
};

struct member_key {
	__u32 list;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct local_key {
	__u32 addr[4];
	__u8 family;
	__u8 pad[3];
};

struct aff_key {
	__u64 affinity_id;
	__u64 client; // the client's network namespace cookie
};

struct aff_val {
	struct backend be;
	__u64 last_ns;
};

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
	__u16 pad;
	__u32 be[4];
	__u16 beport;
	__u16 pad2;
};

// An unconnected UDP socket's flow to one service address, so its datagrams
// stay with one endpoint as conntrack keeps a flow.
struct flow_key {
	__u64 cookie;
	struct svc_key svc;
};

struct config {
	__u64 host_netns_cookie;
	// Translate only the host's own sockets (pods' connections then meet the
	// packet path), as Cilium's socketLB.hostNamespaceOnly.
	__u32 host_only;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} svcproxy_svc SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2097152);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct slot_key);
	__type(value, struct backend);
} svcproxy_slot SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct member_key);
	__type(value, __u8);
} svcproxy_member SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct local_key);
	__type(value, __u8);
} svcproxy_local SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct aff_key);
	__type(value, struct aff_val);
} svcproxy_aff SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct config);
} svcproxy_cfg SEC(".maps");

static __always_inline void read_dst(struct bpf_sock_addr *ctx, int family, __u32 *addr)
{
	if (family == FAMILY_V4) {
		addr[0] = ctx->user_ip4;
	} else {
		addr[0] = ctx->user_ip6[0];
		addr[1] = ctx->user_ip6[1];
		addr[2] = ctx->user_ip6[2];
		addr[3] = ctx->user_ip6[3];
	}
}

static __always_inline void write_dst(struct bpf_sock_addr *ctx, int family,
				      const __u32 *addr, __u16 port)
{
	if (family == FAMILY_V4) {
		ctx->user_ip4 = addr[0];
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
	read_dst(ctx, family, key->addr);
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
	key->family = family;
	struct svc_val *svc = bpf_map_lookup_elem(&svcproxy_svc, key);
	if (svc)
		return svc;
	// A NodePort on every local address.
	struct local_key lk = {};
	lk.addr[0] = key->addr[0];
	lk.addr[1] = key->addr[1];
	lk.addr[2] = key->addr[2];
	lk.addr[3] = key->addr[3];
	lk.family = family;
	if (!bpf_map_lookup_elem(&svcproxy_local, &lk))
		return 0;
	struct svc_key wild = *key;
	wild.addr[0] = 0;
	wild.addr[1] = 0;
	wild.addr[2] = 0;
	wild.addr[3] = 0;
	return bpf_map_lookup_elem(&svcproxy_svc, &wild);
}

static __always_inline int is_member(__u32 list, const struct backend *be)
{
	struct member_key mk = {};
	mk.list = list;
	mk.addr[0] = be->addr[0];
	mk.addr[1] = be->addr[1];
	mk.addr[2] = be->addr[2];
	mk.addr[3] = be->addr[3];
	mk.port = be->port;
	return bpf_map_lookup_elem(&svcproxy_member, &mk) != 0;
}

// 1: the socket call goes on (translated or not); 0: it fails with the error
// set here.
static __always_inline int refuse(int err)
{
	bpf_set_retval(-err);
	return 0;
}

// Translates the destination of ctx to an endpoint. `datagram`: an unconnected
// socket's sendmsg (its flow keeps one endpoint per service address).
// A connected socket that is not translated (again) must not show a service
// address it was translated to earlier.
static __always_inline void forget_peer(struct bpf_sock_addr *ctx)
{
	struct bpf_sock *sk = ctx->sk;
	struct sock_peer *p = sk ? bpf_sk_storage_get(&svcproxy_peer, sk, 0, 0) : 0;
	if (p)
		p->beport = 0;
}

static __always_inline int translate(struct bpf_sock_addr *ctx, int family, int datagram)
{
	struct svc_key key;
	struct svc_val *svc = lookup_service(ctx, family, &key);
	if (!svc) {
		if (!datagram)
			forget_peer(ctx);
		return 1;
	}

	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&svcproxy_cfg, &zero);
	__u64 netns = bpf_get_netns_cookie(ctx);
	int from_host = cfg && netns == cfg->host_netns_cookie;
	if (cfg && cfg->host_only && !from_host)
		return 1;
	struct route *rt = from_host ? &svc->host : &svc->pod;

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
	struct backend chosen;
	int have = 0;

	if (datagram) {
		fk.cookie = cookie;
		fk.svc = key;
		struct backend *prev = bpf_map_lookup_elem(&svcproxy_flow, &fk);
		if (prev && is_member(list, prev)) {
			chosen = *prev;
			have = 1;
		}
	}

	struct aff_key ak = {};
	if (!have && svc->affinity_secs) {
		ak.affinity_id = svc->affinity_id;
		ak.client = netns;
		struct aff_val *av = bpf_map_lookup_elem(&svcproxy_aff, &ak);
		__u64 now = bpf_ktime_get_ns();
		if (av && now - av->last_ns <= (__u64)svc->affinity_secs * 1000000000ULL &&
		    is_member(list, &av->be)) {
			chosen = av->be;
			have = 1;
		}
	}

	if (!have) {
		struct slot_key sk = { .list = list, .slot = bpf_get_prandom_u32() % count };
		struct backend *be = bpf_map_lookup_elem(&svcproxy_slot, &sk);
		if (!be)
			// The list is being replaced under us: leave the call alone
			// rather than guess.
			return 1;
		chosen = *be;
	}

	if (svc->affinity_secs) {
		ak.affinity_id = svc->affinity_id;
		ak.client = netns;
		struct aff_val nv = { .be = chosen, .last_ns = bpf_ktime_get_ns() };
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
		}
	}

	write_dst(ctx, family, chosen.addr, chosen.port);
	return 1;
}

// Shows the service address instead of the endpoint's (recvmsg's source,
// getpeername's peer).
static __always_inline int reverse(struct bpf_sock_addr *ctx, int family)
{
	__u32 addr[4] = {};
	read_dst(ctx, family, addr);
	__u16 port = (__u16)ctx->user_port;
	struct bpf_sock *sk = ctx->sk;
	struct sock_peer *p = sk ? bpf_sk_storage_get(&svcproxy_peer, sk, 0, 0) : 0;
	if (p && p->beport == port && p->be[0] == addr[0] && p->be[1] == addr[1] &&
	    p->be[2] == addr[2] && p->be[3] == addr[3]) {
		write_dst(ctx, family, p->vip, p->vport);
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
		write_dst(ctx, family, rv->addr, rv->port);
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

char LICENSE[] SEC("license") = "Dual BSD/GPL";
