// SPDX-License-Identifier: MIT OR Apache-2.0
//
// tiercel's XDP program: steers the UDP datagrams addressed to tiercel's ports to the AF_XDP socket
// bound to the queue they arrived on, and passes everything else to the kernel unchanged.
//
// `tiercel_ports` holds the UDP ports (network order) whose datagrams are steered; the loader fills
// it. `tiercel_xsks` maps a receive queue to its AF_XDP socket; a queue with no socket passes its
// packets on (XDP_PASS as the redirect's fallback). IP fragments, IPv4 with options, IPv6 and
// anything not UDP pass to the kernel.
//
// Built by tiercel-sys's build.rs with clang (`-target bpf`); loaded with the `aya` crate.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 64);
    __type(key, __u32);
    __type(value, __u32);
} tiercel_xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u16);
    __type(value, __u8);
} tiercel_ports SEC(".maps");

SEC("xdp")
int tiercel_steer(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct udphdr *udp;
    __u16 port;

    if ((void *)(eth + 1) > end)
        return XDP_PASS;
    // IPv4 only: the sockets read IPv4 frames, and IPv6 goes to the kernel's UDP socket on the port.
    if (eth->h_proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
            return XDP_PASS;
        if (ip->frag_off & bpf_htons(0x3fff))
            return XDP_PASS;
        udp = (void *)(ip + 1);
    } else {
        return XDP_PASS;
    }
    if ((void *)(udp + 1) > end)
        return XDP_PASS;
    port = udp->dest;
    if (!bpf_map_lookup_elem(&tiercel_ports, &port))
        return XDP_PASS;
    return bpf_redirect_map(&tiercel_xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
