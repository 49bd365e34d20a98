// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// What svcproxy's programs share: the maps' layouts and definitions (pinned by
// name, so the socket programs of sock.c and the packet programs of tc.c use the
// same maps), and the service lookup. Mirrored by src/ebpf/wire.rs; change both
// together.

#ifndef SVCPROXY_H
#define SVCPROXY_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define ECONNREFUSED 111
#define ETIMEDOUT 110

// A route's action (wire.rs: Action).
#define ACT_FORWARD 0
#define ACT_DROP 1
#define ACT_REJECT 2
#define ACT_PASS 3

// A route's flags.
#define ROUTE_MASQUERADE 1

// A route's scheduler (wire.rs: SCHED_*): how pick() chooses a new
// connection's endpoint from the list.
#define SCHED_RANDOM 0
#define SCHED_RR 1 // in turn: svcproxy_rr's counter of the list
#define SCHED_SH 2 // a hash of the client
#define SCHED_DH 3 // a hash of the service address
#define SCHED_MH 4 // Maglev: the flow's hash names a cell of svcproxy_mh
#define SCHED_LC 5 // the fewest live connections (svcproxy_conns)
// wlc, sed, nq: lc's weighted kin (a weighted list's slots carry their
// endpoint's weight in `pad`).
#define SCHED_WLC 6
#define SCHED_SED 7
#define SCHED_NQ 8
#define SCHED_WRR 9 // as rr: a weighted list's slots are in IPVS's wrr order
#define COUNTS_CONNS(s) ((s) >= SCHED_LC && (s) <= SCHED_NQ)

// The endpoints the lc scheduler compares: all of a list up to this many (as
// IPVS, the first with the fewest), else this many from a random slot on.
#define LC_SCAN 64

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
	__u8 flags; // ROUTE_*
	__u8 sched; // SCHED_*
	__u8 mh_size; // SCHED_MH: the table's size, as an index of mh_cells()
};

struct svc_val {
	struct route pod;  // a socket of a process in any other network namespace
	struct route host; // a socket of a process in the host's network namespace
	struct route pkt_pod;   // a packet from one of this node's pods
	struct route pkt_other; // a packet from anywhere else
	__u64 affinity_id; // the service port, for its affinity entries
	__u64 fw_id; // non-zero: svcproxy_fw must admit a packet's source
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
	__u8 pad; // a slot of a weighted list: the endpoint's weight (else 0)
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
	__u8 family; // the endpoint's (FAMILY_*)
	__u8 counted; // the connection counts in svcproxy_conns until released
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
	// Marks the packet programs set: masquerade this connection (the intent's
	// mark, kube-proxy's 0x4000 by default), reject this packet. Each acted on
	// by one fixed nftables rule.
	__u32 masquerade_mark;
	__u32 reject_mark;
	// Successful writes of the maps by svcproxy so far (0: none yet); the
	// programs do not read it.
	__u32 generation;
};

// loadBalancerSourceRanges: a fenced service port's id and an admitted prefix
// (prefixlen counts the id's 64 bits too).
struct fw_key {
	__u32 prefixlen;
	__u32 id[2];
	__u32 addr[4];
};

// This node's pods' sources (--detect-local-mode ClusterCIDR / NodeCIDR);
// prefixlen counts the family word's 32 bits too.
struct podnet_key {
	__u32 prefixlen;
	__u32 family;
	__u32 addr[4];
};

// A packet-path connection, each way: dir 0 is the client's packets to the
// service address (the value: the endpoint), dir 1 the endpoint's replies to the
// client (the value: the service address to show as their source). dir 2 (UDP):
// the replies a masqueraded flow expects, addressed to the port the kernel's
// masquerade chose (the value: only when, created_ns; the kernel turns them
// back itself).
#define CT_ORIGINAL 0
#define CT_REPLY 1
#define CT_MASQUERADED_REPLY 2
// A connection the XDP program masqueraded itself (tc.c: snat_alloc), each
// way: dir 3 its packets once sent to the endpoint (client to endpoint; the
// value: the node's address and port they leave from), dir 4 the endpoint's
// replies to that address and port (the value: the client).
#define CT_SNAT 3
#define CT_SNAT_REPLY 4

struct ct_key {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 dir; // CT_*
	__u8 pad;
};

struct ct_val {
	__u32 addr[4];
	__u16 port;
	__u8 flags; // ROUTE_MASQUERADE, CT_CLOSING, CT_BPF_SNAT
	__u8 counted; // CT_ORIGINAL: the connection counts in svcproxy_conns
	__u32 seen_s; // CT_ORIGINAL: when a packet of it last passed, in seconds
	__u64 created_ns; // when the connection's endpoint was chosen
};

// ct_val.flags: a FIN or RST of the connection passed.
#define CT_CLOSING 0x80
// CT_ORIGINAL's: the masquerade is svcproxy's own (its CT_SNAT entries), not
// the kernel's conntrack's.
#define CT_BPF_SNAT 0x02
// CT_SNAT_REPLY's: a reply of the connection came (until then its port is held
// as briefly as conntrack holds an unanswered connection).
#define CT_REPLIED 0x04
// CT_REPLY's: the connection's first packet was sent on from XDP (the kernel's
// conntrack never saw it): its replies are kept from the conntrack too.
#define CT_XDP 0x08
// decide()'s answer only, never stored: the packet's connection is new (its
// endpoint chosen for this packet).
#define CT_FRESH 0x40

// The packet path's idle timeouts, in seconds (0: none; the LRU alone forgets):
// kube-proxy's --ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout.
struct timeouts {
	__u32 tcp;
	__u32 tcpfin;
	__u32 udp;
	__u32 pad;
};

struct aff_ip_key {
	__u64 affinity_id;
	__u32 client[4]; // the client's address
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
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32);
	__type(value, struct config);
} svcproxy_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct fw_key);
	__type(value, __u8);
} svcproxy_fw SEC(".maps");

// The service address space's guard: every cluster IP (key as svcproxy_local's)...
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct local_key);
	__type(value, __u8);
} svcproxy_vip SEC(".maps");

// ... and the ServiceCIDRs (key as svcproxy_podnet's).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct podnet_key);
	__type(value, __u8);
} svcproxy_guard SEC(".maps");

// A round-robin list's turn: the connections it has been given.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, __u32); // the list
	__type(value, __u64);
} svcproxy_rr SEC(".maps");

// Each endpoint's live connections, for the lc scheduler, one map a path:
// svcproxy_conns the sockets translated at connect() (counted then, released
// when the socket is: exact), svcproxy_flows the packet path's (counted at a
// connection's first packet, released at its first FIN or RST, and brought back
// to what svcproxy_ct holds by svcproxy at each sync: a connection the LRU
// forgot or that vanished idle goes). LRUs: an endpoint long gone is forgotten.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct backend);
	__type(value, __s64);
} svcproxy_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct backend);
	__type(value, __s64);
} svcproxy_flows SEC(".maps");

// An endpoint's key in svcproxy_conns: its address, port and family (not its
// weight).
static __always_inline void conns_key(struct backend *key, const struct backend *be)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->addr[0] = be->addr[0];
	key->addr[1] = be->addr[1];
	key->addr[2] = be->addr[2];
	key->addr[3] = be->addr[3];
	key->port = be->port;
	key->family = be->family;
}

// Adds `delta` to an endpoint's count in `counts` (svcproxy_conns or _flows).
static __always_inline void count_add(void *counts, const struct backend *be, __s64 delta)
{
	struct backend key;
	conns_key(&key, be);
	__s64 *n = bpf_map_lookup_elem(counts, &key);
	if (!n) {
		if (delta < 0)
			return;
		__s64 zero = 0;
		bpf_map_update_elem(counts, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(counts, &key);
		if (!n)
			return;
	}
	__sync_fetch_and_add(n, delta);
}

// A Maglev list's lookup table, MH_CHUNK cells an entry: each cell the slot of
// the list it names (src/ebpf/maglev.rs in the plan crate fills it).
#define MH_CHUNK 256

struct mh_key {
	__u32 list;
	__u32 chunk;
};

struct mh_val {
	__u16 cell[MH_CHUNK];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__type(key, struct mh_key);
	__type(value, struct mh_val);
} svcproxy_mh SEC(".maps");

// The Maglev table sizes (maglev::SIZES): primes near powers of two.
static __always_inline __u32 mh_cells(__u8 size)
{
	switch (size) {
	case 0:
		return 251;
	case 1:
		return 509;
	case 2:
		return 1021;
	case 3:
		return 2039;
	case 4:
		return 4093;
	case 5:
		return 8191;
	case 6:
		return 16381;
	case 7:
		return 32749;
	default:
		return 65521;
	}
}

// The schedulers' hash: murmur3's finaliser over each word mixed in.
static __always_inline __u32 mix(__u32 h, __u32 w)
{
	h ^= w;
	h *= 0xcc9e2d51;
	h = (h << 15) | (h >> 17);
	h *= 0x1b873593;
	return h;
}

static __always_inline __u32 fmix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 hash_addr(__u32 h, const __u32 *addr)
{
	h = mix(h, addr[0]);
	h = mix(h, addr[1]);
	h = mix(h, addr[2]);
	return mix(h, addr[3]);
}

static __always_inline __u32 hash_u64(__u32 h, __u64 v)
{
	return mix(mix(h, (__u32)v), (__u32)(v >> 32));
}

static __always_inline int addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline void addr_copy(__u32 *to, const __u32 *from)
{
	to[0] = from[0];
	to[1] = from[1];
	to[2] = from[2];
	to[3] = from[3];
}

// Gives back one count of the endpoint at (addr, port, family) in `counts`:
// the release of a socket's (sock.c) or a packet-path connection's (tc.c).
static __always_inline void count_release(void *counts, const __u32 *addr, __u16 port,
					  __u8 family)
{
	struct backend be = {};
	addr_copy(be.addr, addr);
	be.port = port;
	be.family = family;
	count_add(counts, &be, -1);
}

// The entry for key (address, port, protocol, family): the address's own, or
// the every-local-address entry when the address is one of the host's.
static __always_inline struct svc_val *find_service(const struct svc_key *key)
{
	struct svc_val *svc = bpf_map_lookup_elem(&svcproxy_svc, key);
	if (svc)
		return svc;
	struct local_key lk = {};
	addr_copy(lk.addr, key->addr);
	lk.family = key->family;
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
	addr_copy(mk.addr, be->addr);
	mk.port = be->port;
	return bpf_map_lookup_elem(&svcproxy_member, &mk) != 0;
}

#define GUARD_NONE 0
#define GUARD_REJECT 1
#define GUARD_DROP 2

// What the guard says of a destination that is no service address: a cluster
// IP on a port no service exposes is refused, another address of a ServiceCIDR
// dropped (as the packet modes' rules after DNAT).
static __always_inline int guard(const struct svc_key *key)
{
	struct local_key vk = {};
	addr_copy(vk.addr, key->addr);
	vk.family = key->family;
	if (bpf_map_lookup_elem(&svcproxy_vip, &vk))
		return GUARD_REJECT;
	struct podnet_key gk = {};
	gk.prefixlen = 32 + (key->family == FAMILY_V4 ? 32 : 128);
	gk.family = key->family;
	addr_copy(gk.addr, key->addr);
	if (bpf_map_lookup_elem(&svcproxy_guard, &gk))
		return GUARD_DROP;
	return GUARD_NONE;
}

// loadBalancerSourceRanges of the entry admit source `addr`.
static __always_inline int admitted(const struct svc_val *svc, int family, const __u32 *addr)
{
	struct fw_key k = {};
	k.prefixlen = 64 + (family == FAMILY_V4 ? 32 : 128);
	__builtin_memcpy(k.id, &svc->fw_id, sizeof(k.id));
	addr_copy(k.addr, addr);
	return bpf_map_lookup_elem(&svcproxy_fw, &k) != 0;
}

// The lc scheduler's scan: the first of up to LC_SCAN slots from `start` with
// the fewest live connections (in the high word of `least`, its step in the
// low, so that a tie goes to the first scanned); `least` -1 when the list is being replaced under us. One bpf_loop
// step a slot, the minimum taken without a branch: the verifier checks one
// step, not LC_SCAN of them.
struct lc_scan {
	__u32 list;
	__u32 count;
	__u32 start;
	__u32 sched; // SCHED_LC, _WLC, _SED or _NQ
	__s64 least;
};

static long lc_step(__u32 i, void *data)
{
	struct lc_scan *s = data;
	if (!s->count)
		return 1;
	struct slot_key k = { .list = s->list, .slot = (s->start + i) % s->count };
	const struct backend *be = bpf_map_lookup_elem(&svcproxy_slot, &k);
	if (!be) {
		s->least = -1;
		return 1;
	}
	struct backend key;
	conns_key(&key, be);
	__s64 *n = bpf_map_lookup_elem(&svcproxy_conns, &key);
	__s64 *f = bpf_map_lookup_elem(&svcproxy_flows, &key);
	__s64 c = (n ? *n : 0) + (f ? *f : 0);
	c &= ~(c >> 63); // a count raced below 0 is 0
	c &= 0x7fffff;	 // and its overhead fits the high word
	__s64 w = be->pad;
	w += ((w - 1) >> 63) & 1; // an unweighted slot weighs 1
	// IPVS's overheads: lc the connections; wlc per unit of weight; sed the
	// connections once this one is added, per unit of weight; nq as sed but an
	// idle endpoint first (in 1/256ths).
	__s64 over;
	switch (s->sched) {
	case SCHED_WLC:
		over = (c << 8) / w;
		break;
	case SCHED_SED:
		over = ((c + 1) << 8) / w;
		break;
	case SCHED_NQ:
		over = (((c + 1) << 8) / w) & ((-c) >> 63); // busy: sed; idle: 0
		break;
	default:
		over = c;
	}
	__s64 cand = (over << 32) | i; // ties: the first scanned

	__s64 d = s->least - cand; // least < cand: d < 0
	s->least = cand + (d & (d >> 63));
	return 0;
}

// An endpoint of the route's list (count > 0), as its scheduler chooses:
// `hash` is the connection's for the hashing schedulers (the client's for sh,
// the service address's for dh, the flow's for mh): the endpoint in the slots
// map. 0 while the list is being replaced under us.
static __always_inline const struct backend *pick(const struct route *rt, __u32 hash)
{
	struct slot_key sk = { .list = rt->list };
	switch (rt->sched) {
	case SCHED_RR:
	case SCHED_WRR: {
		__u32 list = rt->list;
		__u64 *turn = bpf_map_lookup_elem(&svcproxy_rr, &list);
		if (!turn)
			return 0;
		sk.slot = __sync_fetch_and_add(turn, 1) % rt->count;
		break;
	}
	case SCHED_SH:
	case SCHED_DH:
		sk.slot = fmix(hash) % rt->count;
		break;
	case SCHED_MH: {
		__u32 cell = fmix(hash) % mh_cells(rt->mh_size);
		struct mh_key mk = { .list = rt->list, .chunk = cell / MH_CHUNK };
		struct mh_val *t = bpf_map_lookup_elem(&svcproxy_mh, &mk);
		if (!t)
			return 0;
		sk.slot = t->cell[cell % MH_CHUNK];
		break;
	}
	case SCHED_LC:
	case SCHED_WLC:
	case SCHED_SED:
	case SCHED_NQ: {
		struct lc_scan scan = {
			.list = rt->list,
			.count = rt->count,
			.sched = rt->sched,
			.start = rt->count > LC_SCAN ? bpf_get_prandom_u32() % rt->count : 0,
			.least = 0x7fffffffffffffffLL,
		};
		bpf_loop(rt->count < LC_SCAN ? rt->count : LC_SCAN, lc_step, &scan, 0);
		__s64 least = scan.least;
		if (least < 0)
			return 0;
		least = (scan.start + (__u32)least) % rt->count;
		sk.slot = (__u32)least;
		break;
	}
	default:
		sk.slot = bpf_get_prandom_u32() % rt->count;
	}
	return bpf_map_lookup_elem(&svcproxy_slot, &sk);
}

static __always_inline struct config *config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&svcproxy_cfg, &zero);
}

#endif
