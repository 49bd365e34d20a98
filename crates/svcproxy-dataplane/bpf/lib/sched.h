// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The schedulers: how a new connection's endpoint is chosen from its route's
// list (pick), for the socket programs and the packet path alike, and the maps
// they keep (svcproxy_rr's turns, svcproxy_mh's Maglev tables, the live
// connections of svcproxy_conns and svcproxy_flows). Each path hashes its own
// input (sched_hash: the sockets' in sock.c, the packets' in decide.h).

#ifndef SVCPROXY_LIB_SCHED_H
#define SVCPROXY_LIB_SCHED_H

#include "maps.h"

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
	case 8:
		return 65521;
	default:
		return 131071;
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

// Gives back one count of the endpoint at (addr, port, family) in `counts`:
// the release of a socket's (sock.c) or a packet-path connection's (ct.h).
static __always_inline void count_release(void *counts, const __u32 *addr, __u16 port,
					  __u8 family)
{
	struct backend be = {};
	addr_copy(be.addr, addr);
	be.port = port;
	be.family = family;
	count_add(counts, &be, -1);
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
			// From a random slot: a tie goes to the first scanned, and
			// from slot 0 short connections one at a time (every count
			// 0) would all land on one endpoint, on every node.
			.start = bpf_get_prandom_u32() % rt->count,
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

#endif
