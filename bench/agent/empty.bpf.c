// SPDX-License-Identifier: Apache-2.0
/* The agent's uprobe programs with empty bodies: the probes' own cost, for bench/bench_agent.py. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

SEC("uprobe") int alloc_enter(void *ctx) { return 0; }
SEC("uprobe") int pitch_enter(void *ctx) { return 0; }
SEC("uprobe") int create_enter(void *ctx) { return 0; }
SEC("uprobe") int free_enter(void *ctx) { return 0; }
SEC("uretprobe") int alloc_exit(void *ctx) { return 0; }
SEC("uretprobe") int free_exit(void *ctx) { return 0; }
SEC("uprobe") int init_enter(void *ctx) { return 0; }
SEC("uprobe") int ret_site(void *ctx) { return 0; }
