// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// What every program of svcproxy's starts from: the kernel's BPF definitions,
// the address families as the maps name them, the addresses' helpers, and a
// per-CPU counter's increment.

#ifndef SVCPROXY_LIB_COMMON_H
#define SVCPROXY_LIB_COMMON_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define FAMILY_V4 4
#define FAMILY_V6 6

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

// Counter `stat` of the per-CPU array `map` (svcproxy's statistics maps)
// incremented.
static __always_inline void count_in(void *map, __u32 stat)
{
	__u64 *n = bpf_map_lookup_elem(map, &stat);
	if (n)
		*n += 1;
}

#endif
