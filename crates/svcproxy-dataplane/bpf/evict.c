// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The LRU maps' evictions, counted per map: an fexit program on the kernel
// function an LRU hash map calls to take back an entry it evicts to make room
// (kernel/bpf/hashtab.c, htab_lru_map_delete_node; it returns true when the
// entry was still in the map, not one deleted already). The entry may have been
// a live connection's or one long closed: the kernel cannot tell. A deletion by
// a program or by svcproxy goes another way (htab_lru_map_delete_elem) and is
// not counted.
//
// The program runs for every LRU map of the kernel: it counts only the maps
// whose ids svcproxy put in svcproxy_evictions (its own, by their pins), one
// lookup per eviction and nothing on any other path. Not pinned: each process
// loads its own and counts from its start (a counter, reset by a restart).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

// The kernel's own types, only the fields read (CO-RE: their offsets come
// from the running kernel's BTF at load).
struct bpf_map___svcproxy {
	__u32 id;
} __attribute__((preserve_access_index));

struct bpf_htab___svcproxy {
	struct bpf_map___svcproxy map;
} __attribute__((preserve_access_index));

// Map id -> evictions so far. Only the ids svcproxy wrote are counted.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u64);
} svcproxy_evictions SEC(".maps");

// static bool htab_lru_map_delete_node(void *arg, struct bpf_lru_node *node):
// arg is the map's struct bpf_htab.
SEC("fexit/htab_lru_map_delete_node")
int svcproxy_evicted(unsigned long long *ctx)
{
	struct bpf_htab___svcproxy *htab = (void *)ctx[0];
	// Still in the map: an entry evicted, not one already deleted.
	if (!(__u8)ctx[2])
		return 0;
	__u32 id = BPF_CORE_READ(htab, map.id);
	__u64 *n = bpf_map_lookup_elem(&svcproxy_evictions, &id);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
