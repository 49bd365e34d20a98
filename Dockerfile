# syntax=docker/dockerfile:1
# svcproxy's node image: the binary (built on the same Debian release it runs on) and
# the tools it runs: nft (nftables mode: every ruleset change is one `nft -f`
# transaction), iptables (iptables mode: iptables-restore/-save, both the nf_tables and
# legacy variants; svcproxy uses whichever `iptables` points to) and ip (iproute2: the
# node's addresses for CIDR nodePortAddresses). Conntrack cleanup uses netlink directly,
# so no conntrack tool.
#
#   docker build -t ghcr.io/svcproxy/svcproxy:0.1.0 .
#
# Manifests: deploy/ (see deploy/README.md).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p svcproxy \
 && install -s -D -m 0755 target/release/svcproxy /out/svcproxy

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iptables iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/svcproxy /usr/local/bin/svcproxy
# No USER: programming nftables takes uid 0 with CAP_NET_ADMIN (deploy/ grants only
# NET_ADMIN and NET_RAW, drops every other capability, and mounts the root read-only).
ENTRYPOINT ["/usr/local/bin/svcproxy"]
