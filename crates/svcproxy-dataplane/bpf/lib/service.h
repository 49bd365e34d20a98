// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
//
// The service lookup: a destination's entry (find_service), whether an endpoint
// is still in a list (is_member), the guard of the service address space
// (guard) and loadBalancerSourceRanges (admitted).

#ifndef SVCPROXY_LIB_SERVICE_H
#define SVCPROXY_LIB_SERVICE_H

#include "maps.h"

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

#endif
