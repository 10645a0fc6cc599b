// SPDX-License-Identifier: Apache-2.0
/* gpuflame agent: uprobes on the CUDA driver's allocation and free functions.
 *
 * At each successful allocation (in the uretprobe, while the calling thread is
 * still inside the driver, so its interpreter frames cannot change) this walks
 * the thread's CPython frames and sends (code object, instruction pointer) per
 * frame to user space, which names them. The kernel keeps the live blocks
 * (address, or handle for cuMemCreate) so that a free of a block allocated
 * before the agent started is counted here and never sent. Built once with
 * clang -target bpf against a vmlinux.h (CO-RE: one object for every kernel
 * with BTF).
 */
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "agent.h"

char LICENSE[] SEC("license") = "GPL";

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, RING_BYTES);
} events SEC(".maps");

/* tgid -> where its interpreter is and how its structures are laid out */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, MAX_PROCS);
    __type(key, __u32);
    __type(value, struct proc);
} procs SEC(".maps");

/* (tgid, address or handle) -> size: the blocks live now; user space sizes it
 * (--max-blocks). Preallocated: an insert at every allocation must not allocate. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 262144);
    __type(key, struct block_key);
    __type(value, __u64);
} live SEC(".maps");

/* processes that loaded a driver file before its probes were in (user space adds them): a free of a block
 * never seen is theirs to count, sent flagged F_UNKNOWN, not counted among the blocks from before the agent */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, MAX_PROCS);
    __type(key, __u32);
    __type(value, __u8);
} late SEC(".maps");

/* per thread: the driver call it is inside, its PyThreadState, its last stack */
struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct thread_state);
} threads SEC(".maps");

/* processes already announced to user space (one wake-up per process) */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u8);
} announced SEC(".maps");

/* (tgid, stack hash) already sent: a new stack wakes the reader at once, so that its
 * code objects are read while the process is alive (it may exit right after) */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct stack_key);
    __type(value, __u8);
} stacks_seen SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct event);
} scratch SEC(".maps");

/* the frames the walk has read: a page up to the end of a frame in it (WINDOW_BYTES - 1 + FRAME_BYTES at
 * most), and room for a field read at any offset the masks allow from a frame at the page's last byte */
struct window {
    __u64 lo, hi; /* the addresses it holds */
    __u8 bytes[WINDOW_BYTES + 128];
};
_Static_assert(FRAME_BYTES <= 128, "a window holds a page and the end of a frame that starts at its last byte");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct window);
} windows SEC(".maps");

/* (tgid, code object) already sent as a code record */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct code_key);
    __type(value, __u8);
} codes_seen SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct code_record);
} code_scratch SEC(".maps");

/* SET_ONLY_REGISTERED, SET_ENTRY_ONLY (agent.h) */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, N_SETTINGS);
    __type(key, __u32);
    __type(value, __u32);
} settings SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, N_STATS);
    __type(key, __u32);
    __type(value, __u64);
} stats SEC(".maps");

/* entry-only: (tgid, return address) already sent as an EV_SITE */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct site_key);
    __type(value, __u8);
} sites_seen SEC(".maps");

static __always_inline int setting(__u32 which)
{
    __u32 *v = bpf_map_lookup_elem(&settings, &which);
    return v && *v;
}

static __always_inline void set_setting(__u32 which)
{
    __u32 *v = bpf_map_lookup_elem(&settings, &which);
    if (v && !*v)
        *v = 1;
}

static __always_inline void add(__u32 which, __u64 n)
{
    __u64 *v = bpf_map_lookup_elem(&stats, &which);
    if (v)
        *v += n;
}

static __always_inline void count(__u32 which)
{
    add(which, 1);
}

/* Wake the reader only when this record takes the backlog past WAKE_BYTES: a
 * wake-up per record costs more than the record (the reader also drains the ring
 * every POLL_MS on its own), and one wake-up per crossing is enough. */
static __always_inline __u64 wake_flags(int force, __u64 len)
{
    __u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
    if (force || (avail < WAKE_BYTES && avail + len >= WAKE_BYTES))
        return BPF_RB_FORCE_WAKEUP;
    return BPF_RB_NO_WAKEUP;
}

/* A record into the ring. The ring also refuses records when far from full: seen on Linux 6.18 with 4 threads
 * racing on 2 vCPUs, about 1 record in 200,000 while each run of the race wrote 4 MB into the 16 MiB ring
 * (the reservation's lock giving up, or a reservation check racing the reader). The refusals come in short
 * bursts: such a record is tried again, up to OUTPUT_TRIES times in all (race tests of 10 runs each that lost
 * records: tried once, 11 of 16; 8 times, 8 of 16; 32 times, 1 of 32; 128 times, 0 of 16, and 0 of 12 beside
 * two busy loops). A full ring is not retried: the reader is behind. Either way the loss is counted; a
 * refusal also as such. The loop costs ~0.4 s of CPU once, when the object is loaded (the verifier). */
static __always_inline int output(void *data, __u64 len, __u64 flags)
{
    for (int i = 0; i < OUTPUT_TRIES; i++) { /* bounded; called from global functions only: checked once */
        if (!bpf_ringbuf_output(&events, data, len, flags))
            return 0;
        __u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA); /* racy: may read past the producer */
        if (avail <= RING_BYTES && avail + len + 8 > RING_BYTES) {
            count(STAT_LOST_EVENTS); /* full: the reader is behind */
            return -1;
        }
    }
    count(STAT_LOST_EVENTS);
    count(STAT_RING_REFUSED);
    return -1;
}

static __always_inline int device_of(__u32 kind)
{
    return (kind == K_ALLOC_HOST || kind == K_HOST_ALLOC || kind == K_FREE_HOST) ? DEVICE_HOST : DEVICE_CUDA;
}

static __always_inline struct thread_state *stash(__u32 kind, __u64 out, __u64 size, __u64 extra, __s32 device)
{
    struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0,
                                                  BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!t) {
        count(STAT_CALLS_FULL);
        return 0;
    }
    t->call.kind = kind;
    t->call.device = device;
    t->call.out = out;
    t->call.size = size;
    t->call.extra = extra;
    t->in_call = 1;
    return t;
}

/* The call the thread is returning from (and its state), or NULL. */
static __always_inline struct thread_state *returning(struct inflight *call)
{
    struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
    if (!t || !t->in_call)
        return 0;
    t->in_call = 0;
    *call = t->call;
    return t;
}

static __always_inline __u32 namespaced_tid(struct task_struct *task)
{
    struct pid *pid = BPF_CORE_READ(task, thread_pid);
    unsigned int level = BPF_CORE_READ(pid, level);
    struct upid up = {};
    bpf_core_read(&up, sizeof(up), &pid->numbers[level & 31]);
    return up.nr;
}

static __always_inline __u64 read_ptr(__u64 addr)
{
    __u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)addr);
    return v;
}

/* All ones when *d* is 0, else 0, without a branch: the barrier keeps clang from turning it back into a
 * compare-and-jump. */
static __always_inline __u64 zero_mask(__u64 d)
{
    __u64 neg = -d;
    asm volatile("" : "+r"(neg));
    return ((d | neg) >> 63) - 1;
}

struct thread_search {
    __u64 ts;    /* the next thread to read; 0: the list's end */
    __u64 want;  /* the id of the calling thread */
    __u64 found; /* its PyThreadState, once found */
    __s32 id_off;
    __s32 next_off;
};

/* THREAD_CHUNK threads of the search, from s->ts. A global function: the verifier checks its bounded
 * loop once per program, not once per call, so the search's cost to it does not grow with MAX_THREADS
 * (5.15 has no bpf_loop). No branch on what it reads but the list's end (a read past the end gives 0,
 * no thread's id). */
__noinline int search_threads(struct thread_search *s)
{
    if (!s)
        return 0;
    __u64 ts = s->ts, want = s->want, found = 0, v;
    for (int i = 0; i < THREAD_CHUNK && ts; i++) {
        bpf_probe_read_user(&v, sizeof(v), (void *)(ts + s->id_off)); /* a failed read gives 0 */
        found |= ts & zero_mask(v ^ want);
        bpf_probe_read_user(&v, sizeof(v), (void *)(ts + s->next_off));
        ts = v;
    }
    s->ts = ts;
    s->found = found;
    return 0;
}

/* The PyThreadState of the calling thread: its native_thread_id (3.11+) is the
 * namespaced tid; 3.10 has only thread_id, pthread_self(), which is the FS base. */
static __always_inline __u64 find_tstate(struct proc *p, struct thread_state *t)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task();
    int native = p->off.tstate_native_thread_id >= 0;
    struct thread_search s = {};
    if (native) {
        __u32 tid = (__u32)bpf_get_current_pid_tgid();
        if (t->tid != tid || !t->ns_tid) { /* read once per thread: it keeps its id until an exec */
            t->ns_tid = namespaced_tid(task);
            t->tid = tid;
        }
        s.want = t->ns_tid;
    } else {
        s.want = BPF_CORE_READ(task, thread.fsbase);
    }
    s.id_off = native ? p->off.tstate_native_thread_id : p->off.tstate_thread_id;
    s.next_off = p->off.tstate_next;
    if (t->tstate && read_ptr(t->tstate + s.id_off) == s.want)
        return t->tstate;
    __u64 interp = read_ptr(p->runtime + p->off.runtime_interp_head);
    if (!interp || !s.want)
        return 0;
    s.ts = read_ptr(interp + p->off.interp_threads_head);
    for (int c = 0; c < MAX_THREADS / THREAD_CHUNK && s.ts && !s.found; c++)
        search_threads(&s);
    t->tstate = s.found;
    return s.found;
}

/* Where the frame at *frame* starts in the window (read anew if it is not there), or -1 where it cannot be
 * read. The window runs from the start of the frame's own page to the frame's end, never below: that page
 * holds the frame, so it can be read whenever the frame can, and the frames below it in the page (a
 * thread's older interpreter frames, 3.11+) come with it. A window reaching below the page read memory the
 * walk does not need: below a thread's first frames (its data stack's first page) lies whatever the process
 * mapped there, and where that page was unmapped or never touched the read faulted, failed, and each frame
 * was read again alone, a fault per frame (see BENCHMARKS.md). A global function: the verifier checks its
 * branches once per program, not once per step of the walk. */
__noinline long window_at(struct window *w, __u64 frame)
{
    if (!w)
        return -1;
    if (frame < w->lo || frame + FRAME_BYTES > w->hi) {
        __u64 lo = frame & ~(__u64)(WINDOW_BYTES - 1);
        __u64 len = (frame & (WINDOW_BYTES - 1)) + FRAME_BYTES; /* at most WINDOW_BYTES - 1 + FRAME_BYTES */
        count(STAT_FRAME_READS);
        if (bpf_probe_read_user(w->bytes, len, (void *)lo)) {
            w->lo = w->hi = 0;
            return -1;
        }
        w->lo = lo;
        w->hi = frame + FRAME_BYTES;
    }
    __u64 off = frame - w->lo;
    return off > WINDOW_BYTES - 1 ? -1 : (long)off;
}

/* Walks the frames into *e*; returns their hash. The frames are read a window at a time (window_at):
 * the fields the walk needs all sit in a frame's first FRAME_BYTES bytes. A bounded loop, not bpf_loop
 * (5.17): the count of frames kept is re-read from the event at each step (volatile), so the verifier
 * sees any count below MAX_FRAMES there, not one state per count. A global function: the verifier
 * checks it once per program, not once per way a program comes to call it. */
__noinline __u64 walk_python(struct proc *p, struct thread_state *t, struct event *e)
{
    if (!p || !t || !e)
        return 0;
    __u64 ts = find_tstate(p, t);
    if (!ts) {
        e->flags |= F_NO_THREAD;
        return 0;
    }
    __u32 zero = 0;
    struct window *w = bpf_map_lookup_elem(&windows, &zero);
    if (!w)
        return 0;
    volatile struct py_offsets *o = &p->off; /* read at each step: a value kept across steps, once tested,
                                               * would split the verifier's states for every step after */
    __u64 hash = 0xcbf29ce484222325ull;
    __u64 frame;
    w->lo = w->hi = 0; /* another walk's window: not this thread's memory */
    if (o->tstate_cframe >= 0)
        frame = read_ptr(read_ptr(ts + o->tstate_cframe) + o->cframe_current_frame);
    else
        frame = read_ptr(ts + o->tstate_frame);
    volatile __u16 *kept = &e->nframes;
    *kept = 0;
    for (int i = 0; i < MAX_WALK && frame; i++) {
        long off = window_at(w, frame);
        if (off < 0 || off > WINDOW_BYTES - 1) {
            frame = 0;
            break;
        }
        __u8 *raw = w->bytes + off;
        __u64 here = frame;
        frame = *(__u64 *)(raw + (o->frame_previous & RAW_U64_MASK));
        __s32 owner = o->frame_owner;
        if (owner >= 0 && o->owner_cstack >= 0 && raw[owner & RAW_U8_MASK] >= o->owner_cstack)
            continue; /* a shim frame of the C stack or the interpreter (3.12+): no code object */
        __u32 n = *kept;
        if (n >= MAX_FRAMES) {
            frame = here;
            break;
        }
        /* 3.14's f_executable is a tagged reference (_PyStackRef): objects are 8-aligned, the low bits are tags */
        __u64 code = *(__u64 *)(raw + (o->frame_code & RAW_U64_MASK)) & ~7ull;
        __u64 instr;
        __s32 instr_off = o->frame_instr;
        if (o->frame_instr_size == 4)
            instr = *(__u32 *)(raw + (instr_off & RAW_U32_MASK));
        else
            instr = *(__u64 *)(raw + (instr_off & RAW_U64_MASK));
        e->frames[n].code = code;
        e->frames[n].instr = instr;
        hash = (hash ^ code ^ (instr << 17)) * 0x100000001b3ull;
        *kept = n + 1;
    }
    if (frame)
        e->flags |= F_TRUNCATED;
    return hash;
}

/* True the first time this process sends this stack (Python frames hashed by the walk, native ones here). */
static __always_inline int new_stack(struct event *e, __u64 hash)
{
    if (e->nnative) {
        __u32 off = e->nframes < MAX_FRAMES ? e->nframes : MAX_FRAMES;
        __u64 *words = (__u64 *)&e->frames[off];
        __u32 n = e->nnative;
        for (__u32 i = 0; i < MAX_NATIVE && i < n; i++)
            hash = (hash ^ words[i]) * 0x100000001b3ull;
    }
    struct stack_key key = {.tgid = e->tgid, .hash = hash};
    if (bpf_map_lookup_elem(&stacks_seen, &key))
        return 0;
    __u8 one = 1;
    bpf_map_update_elem(&stacks_seen, &key, &one, BPF_ANY);
    return 1;
}

static __always_inline struct event *new_event(__u8 type, __u32 kind, int full)
{
    __u32 zero = 0;
    struct event *e = bpf_map_lookup_elem(&scratch, &zero);
    if (!e)
        return 0;
    __u64 id = bpf_get_current_pid_tgid();
    e->type = type;
    e->kind = kind;
    e->nframes = 0;
    e->nnative = 0;
    e->flags = 0;
    e->tgid = id >> 32;
    e->tid = (__u32)id;
    e->addr = 0;
    e->size = 0;
    e->device = 0;
    e->seq = 0;
    if (full) { /* a free needs neither: user space knows the process */
        e->ts = bpf_ktime_get_ns();
        bpf_get_current_comm(e->comm, sizeof(e->comm));
    }
    return e;
}

/* An event into the ring: output() in a global function, verified once per program, not at each caller. */
__noinline int output_event(struct event *e, __u64 len, __u64 flags)
{
    if (!e)
        return -1;
    if (len > sizeof(struct event))
        len = sizeof(struct event);
    if (!output(e, len, flags))
        return 0;
    /* lost: what it was, so that the profile can say how many allocations (and bytes) and frees are missing */
    if (e->type == EV_ALLOC || (e->type == EV_RESULT && !(e->flags & F_FAILED))) {
        count(STAT_LOST_ALLOCS);
        add(STAT_LOST_ALLOC_BYTES, e->size);
    } else if ((e->type == EV_FREE || (e->type == EV_VMM && e->kind == K_UNMAP)) && !(e->flags & F_FAILED)) {
        count(STAT_LOST_FREES);
    }
    return -1;
}

static __always_inline void send(struct event *e, int force)
{
    __u64 len = sizeof(struct event_header) + (__u64)(e->nframes & (MAX_FRAMES * 2 - 1)) * sizeof(struct py_frame);
    len += (__u64)(e->nnative & (MAX_NATIVE * 2 - 1)) * 8;
    if (len > sizeof(struct event))
        len = sizeof(struct event);
    output_event(e, len, wake_flags(force, len));
}

static __always_inline void announce(__u32 tgid, struct proc *p)
{
    __u8 one = 1;
    if (p || bpf_map_lookup_elem(&announced, &tgid))
        return;
    bpf_map_update_elem(&announced, &tgid, &one, BPF_ANY);
    struct event *e = new_event(EV_NEW_PROCESS, 0, 1);
    if (e)
        send(e, 1);
}

/* A str object's characters (compact: ASCII, or 1/2/4 bytes each), at most *cap* bytes. */
static __always_inline void copy_str(struct code_offsets *o, __u64 str, char *buf, __u32 cap, __u32 *state,
                                     __u32 *len)
{
    __u32 st = 0;
    __s64 n = 0;
    bpf_probe_read_user(&st, sizeof(st), (void *)(str + o->unicode_state));
    bpf_probe_read_user(&n, sizeof(n), (void *)(str + o->unicode_length));
    *state = st;
    *len = (__u32)n;
    __u32 kind = (st >> 2) & 7;
    __u64 data = str + ((st >> 6) & 1 ? o->unicode_ascii_data : o->unicode_compact_data);
    __u64 bytes = (__u64)n * (kind ? kind : 1);
    if (bytes > cap)
        bytes = cap;
    if (bytes)
        bpf_probe_read_user(buf, bytes, (void *)data);
}

/* One code object of a new stack, as a code record, unless sent already. A global function: the
 * verifier checks it once, not once per frame of the loop that calls it (5.15 has no bpf_loop). */
__noinline int send_code(struct code_offsets *o, __u32 tgid, __u64 code)
{
    if (!o)
        return 0;
    struct code_key key = {.tgid = tgid, .code = code};
    if (bpf_map_lookup_elem(&codes_seen, &key))
        return 0;
    __u8 one = 1;
    bpf_map_update_elem(&codes_seen, &key, &one, BPF_ANY);
    __u32 zero = 0;
    struct code_record *r = bpf_map_lookup_elem(&code_scratch, &zero);
    if (!r)
        return 0;
    r->type = EV_CODE;
    r->tgid = tgid;
    r->code = code;
    r->firstlineno = 0;
    bpf_probe_read_user(&r->firstlineno, 4, (void *)(code + o->code_firstlineno));
    copy_str(o, read_ptr(code + o->code_name), r->name, CODE_NAME_BYTES, &r->name_state, &r->name_len);
    copy_str(o, read_ptr(code + o->code_filename), r->file, CODE_FILE_BYTES, &r->file_state, &r->file_len);
    __u64 table = read_ptr(code + o->code_linetable);
    __s64 n = 0;
    bpf_probe_read_user(&n, sizeof(n), (void *)(table + o->bytes_size));
    r->table_len = (__u32)n;
    __u64 bytes = n > CODE_TABLE_BYTES ? CODE_TABLE_BYTES : (n < 0 ? 0 : n);
    if (bytes)
        bpf_probe_read_user(r->table, bytes > CODE_TABLE_BYTES ? CODE_TABLE_BYTES : bytes,
                            (void *)(table + o->bytes_data));
    output(r, sizeof(*r), 0);
    return 0;
}

/* Before a new stack's record: its code objects not sent yet (a bounded loop, not bpf_loop). */
static __always_inline void send_codes(struct event *e, struct proc *p)
{
    __u32 n = e->nframes;
    for (__u32 i = 0; i < MAX_FRAMES && i < n; i++)
        send_code(&p->code, e->tgid, e->frames[i].code);
}

/* An allocation's event: its Python stack (and native frames where needed), sent to user space.
 * *addr*: the block, or (entry-only, F_PENDING) where the driver will write it. *ret*: the return
 * address at entry (entry-only), which stands for the caller's frame the unwinder cannot see there. */
static __always_inline int record_alloc(struct pt_regs *ctx, struct thread_state *t, struct inflight *call,
                                        __u64 addr, __u64 size, __u16 flags, __u64 ret)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    struct proc *p = bpf_map_lookup_elem(&procs, &tgid);
    if (!p && setting(SET_ONLY_REGISTERED))
        return 0;
    struct event *e = new_event(EV_ALLOC, call->kind, 0); /* user space has the comm */
    if (!e)
        return 0;
    e->addr = addr;
    e->size = size;
    e->device = call->device;
    e->flags = flags;
    if (flags & F_PENDING) {
        e->seq = t->seq;
    } else if (call->kind != K_CREATE) { /* a handle's references are counted in user space */
        struct block_key key = {.tgid = tgid, .handle = 0, .addr = addr};
        long err = bpf_map_update_elem(&live, &key, &size, BPF_NOEXIST); /* one map operation, mostly */
        if (err == -17 /* EEXIST */) {
            e->flags |= F_REPLACED; /* no free of it was seen (frees are sent at their entry) */
            err = bpf_map_update_elem(&live, &key, &size, BPF_ANY);
        }
        if (err) {
            e->flags |= F_UNTRACKED;
            count(STAT_LIVE_FULL);
            set_setting(SET_LIVE_OVERFLOWED);
        }
    }
    __u64 hash = 0;
    if (p && p->runtime) {
        hash = walk_python(p, t, e);
        if (hash)
            hash = (hash ^ p->code_epoch) * 0x100000001b3ull;
    }
    else if (!p)
        e->flags |= F_NOT_REGISTERED; /* registered without Python (native code, an unsupported one): not late */
    if (!p || !p->runtime || (p->flags & P_NATIVE)) {
        __u32 off = e->nframes & (MAX_FRAMES - 1);
        if (e->nframes >= MAX_FRAMES)
            off = MAX_FRAMES;
        long got = bpf_get_stack(ctx, &e->frames[off], MAX_NATIVE * 8, BPF_F_USER_STACK);
        if (got > 0) {
            e->nnative = got / 8;
            if (ret) /* at entry the first word is the driver function itself, its caller is missing */
                *(__u64 *)&e->frames[off] = ret;
        }
    }
    /* the same stack as this thread's last allocation: not new, no lookup */
    int fresh = 0;
    if (!hash || hash != t->last_hash || e->nnative) {
        fresh = new_stack(e, hash);
        t->last_hash = hash;
    }
    if (fresh && p && p->runtime && e->nframes)
        send_codes(e, p);
    send(e, fresh);
    announce(tgid, p);
    return 1;
}

SEC("uretprobe")
int BPF_KRETPROBE(alloc_exit, long rc)
{
    struct inflight call;
    struct thread_state *t = returning(&call);
    if (!t || rc != 0)
        return 0; /* a failed call allocated nothing */
    __u64 size = call.size;
    if (call.kind == K_ALLOC_PITCH)
        size = read_ptr(call.extra) * call.size; /* the real pitch, read back, times Height */
    record_alloc(ctx, t, &call, read_ptr(call.out), size, 0, 0);
    return 0;
}

/* -- entry-only probes (--probes entry): no uretprobe, so nothing rewrites a return address and no
 * uretprobe syscall runs (6.11-6.13 let a seccomp filter kill a process for it). An allocation is
 * recorded at its entry (the thread is entering the driver: its interpreter frames cannot change
 * until the call returns) and its output pointer kept per thread; the result is read back at the
 * call's return site once user space has put a plain uprobe there (exact: the return code is in
 * rax). Before that, at the thread's next probed entry, and only where the output is a variable in
 * a stack frame still live (*out changed from its value at entry: success; unchanged: failure):
 * heap memory may have been freed and reused by then. A free counts at its entry. */

/* The pending allocation's outcome, as an EV_RESULT. *returned*: at the return site, with its code. */
static __always_inline void settle(struct thread_state *t, int returned, __s32 rc, __u64 sp)
{
    if (!t->pending)
        return;
    t->pending = 0;
    struct inflight *c = &t->call;
    struct event *e = new_event(EV_RESULT, c->kind, 0);
    if (!e)
        return;
    __u64 addr = 0;
    int unread = bpf_probe_read_user(&addr, sizeof(addr), (void *)c->out);
    e->addr = addr;
    e->size = c->kind == K_ALLOC_PITCH ? read_ptr(c->extra) * c->size : c->size;
    e->seq = t->seq;
    e->device = c->device;
    if (returned) {
        e->flags |= rc != 0 || unread ? F_FAILED : F_RETURNED;
    } else if (c->out < c->sp || c->out - c->sp >= STACK_SPAN || sp > c->out) {
        /* heap memory the caller may have freed and reused (a ctypes c_uint64 is, at once), or a stack
         * frame that has returned: what is there now says nothing sure about this call */
        e->flags |= F_UNKNOWN;
    } else if (unread || addr == c->before) {
        e->flags |= F_FAILED; /* a live frame's variable, unchanged: the call failed */
    }
    send(e, 0);
}

/* Tells user space of a return address it may probe (once per process and address). */
static __always_inline __u64 note_site(__u64 sp)
{
    __u64 ret = read_ptr(sp);
    struct site_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .addr = ret};
    if (!ret || bpf_map_lookup_elem(&sites_seen, &key))
        return ret;
    __u8 one = 1;
    bpf_map_update_elem(&sites_seen, &key, &one, BPF_ANY);
    struct event *e = new_event(EV_SITE, 0, 0);
    if (e) {
        e->addr = ret;
        send(e, 1); /* at once: the sooner the site is probed, the fewer results read late */
    }
    return ret;
}

/* Every probed entry: the thread's previous call has returned, so its result can be read. *site*:
 * the return site is worth a probe (an allocation's; cuInit's, which often shares it, as ctypes' one
 * call instruction does; not a free's, which returns nothing to read). */
static __always_inline struct thread_state *entering(struct pt_regs *ctx, int create, int site, __u64 *ret)
{
    struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0,
                                                  create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
    __u64 sp = PT_REGS_SP(ctx);
    if (t)
        settle(t, 0, 0, sp);
    *ret = site ? note_site(sp) : read_ptr(sp);
    return t;
}

static __always_inline void alloc_at_entry(struct pt_regs *ctx, __u32 kind, __u64 out, __u64 size, __u64 extra,
                                           __s32 device)
{
    __u64 ret;
    struct thread_state *t = entering(ctx, 1, 1, &ret);
    if (!t) {
        count(STAT_CALLS_FULL);
        return;
    }
    struct inflight *c = &t->call;
    c->kind = kind;
    c->device = device;
    c->out = out;
    c->size = size;
    c->extra = extra;
    c->before = read_ptr(out);
    c->sp = PT_REGS_SP(ctx);
    t->seq += 1;
    if (record_alloc(ctx, t, c, out, size, F_PENDING, ret))
        t->pending = 1;
}

static __always_inline void free_at_entry(struct pt_regs *ctx, __u32 kind, __u64 addr, __s32 device)
{
    __u64 ret;
    entering(ctx, 0, 0, &ret);
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!bpf_map_lookup_elem(&procs, &tgid) && setting(SET_ONLY_REGISTERED))
        return;
    struct event *e = new_event(EV_FREE, kind, 0); /* user space matches it (it knows every block) */
    if (!e)
        return;
    e->addr = addr;
    e->device = device;
    send(e, 0);
}

/* A plain uprobe on the instruction a driver call returns to (entry-only): the pending call of this
 * thread returns here when the stack pointer is the entry's plus the popped return address. */
SEC("uprobe")
int BPF_KPROBE(ret_site)
{
    struct thread_state *t = bpf_task_storage_get(&threads, bpf_get_current_task_btf(), 0, 0);
    if (!t || !t->pending || PT_REGS_SP(ctx) != t->call.sp + 8)
        return 0;
    settle(t, 1, (__s32)PT_REGS_RC(ctx), 0);
    return 0;
}

/* cuMemAlloc_v2, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemAllocManaged,
 * cuMemAllocHost_v2, cuMemHostAlloc: (out pointer, size, ...); the kind is the attach cookie. */
SEC("uprobe")
int BPF_KPROBE(alloc_enter, void *out, __u64 size)
{
    __u32 kind = bpf_get_attach_cookie(ctx);
    if (setting(SET_ENTRY_ONLY))
        alloc_at_entry(ctx, kind, (__u64)out, size, 0, device_of(kind));
    else
        stash(kind, (__u64)out, size, 0, device_of(kind));
    return 0;
}

/* cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes): size = *pPitch * Height */
SEC("uprobe")
int BPF_KPROBE(pitch_enter, void *out, void *pitch, __u64 width, __u64 height)
{
    if (setting(SET_ENTRY_ONLY))
        alloc_at_entry(ctx, K_ALLOC_PITCH, (__u64)out, height, (__u64)pitch, DEVICE_CUDA);
    else
        stash(K_ALLOC_PITCH, (__u64)out, height, (__u64)pitch, DEVICE_CUDA);
    return 0;
}

/* cuMemCreate(handle, size, prop, flags): physical memory on prop->location */
SEC("uprobe")
int BPF_KPROBE(create_enter, void *out, __u64 size, void *prop)
{
    __s32 loc[2] = {0, 0}; /* CUmemAllocationProp.location: {type, id} after two ints */
    __s32 device = DEVICE_CUDA;
    if (!bpf_probe_read_user(loc, sizeof(loc), prop + 8)) {
        if (loc[0] == 1)
            device = loc[1] & 0xffff; /* CU_MEM_LOCATION_TYPE_DEVICE: the ordinal */
        else if (loc[0] >= 2 && loc[0] <= 4)
            device = DEVICE_HOST;
    }
    if (setting(SET_ENTRY_ONLY))
        alloc_at_entry(ctx, K_CREATE, (__u64)out, size, 0, device);
    else
        stash(K_CREATE, (__u64)out, size, 0, device);
    return 0;
}

/* A free-like call booked at its entry (EV_FREE), or, flagged F_FAILED, the undo of one the driver refused. */
static __always_inline void send_free(__u32 kind, __u64 addr, __u64 size, __s32 device, __u16 flags)
{
    struct event *e = new_event(EV_FREE, kind, 0);
    if (!e)
        return;
    e->addr = addr;
    e->size = size;
    e->device = device;
    e->flags = flags;
    send(e, 0);
}

/* cuMemFree_v2, cuMemFreeAsync, cuMemRelease, cuMemFreeHost: (address or handle, ...). A free takes effect
 * when it is called: the driver may hand its address out again from inside the call, to another thread whose
 * allocation then returns (and is sent) before this free returns. So the block leaves `live` and its free is
 * sent here, at the entry, ahead in the ring of any allocation of that address; the uretprobe undoes it if
 * the driver refused the call (F_FAILED: the block lives on, and its address was not handed out). */
SEC("uprobe")
int BPF_KPROBE(free_enter, __u64 addr)
{
    __u32 kind = bpf_get_attach_cookie(ctx);
    if (setting(SET_ENTRY_ONLY)) {
        free_at_entry(ctx, kind, addr, device_of(kind));
        return 0;
    }
    struct thread_state *t = stash(kind, addr, 0, 0, device_of(kind));
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u64 size = 0, sent = 0; /* sent: 1 a known block, 2 a handle or an address matched in user space */
    if (kind == K_RELEASE) { /* a handle: user space counts its references */
        if (setting(SET_ONLY_REGISTERED) && !bpf_map_lookup_elem(&procs, &tgid))
            return 0;
        sent = 2;
    } else {
        struct block_key key = {.tgid = tgid, .handle = 0, .addr = addr};
        __u64 *live_size = bpf_map_lookup_elem(&live, &key);
        if (live_size) {
            size = *live_size;
            bpf_map_delete_elem(&live, &key);
            sent = 1;
        } else if (setting(SET_LIVE_OVERFLOWED)) {
            sent = 2; /* the live map overflowed: user space matches the frees it does not know (it books every
                       * allocation, the untracked ones too) */
        }
    }
    if (t) {
        t->call.size = size;
        t->call.extra = sent;
    }
    if (sent)
        send_free(kind, addr, size, device_of(kind), 0);
    return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(free_exit, long rc)
{
    struct inflight call;
    if (!returning(&call))
        return 0;
    if (rc == 0) {
        if (call.extra)
            return 0;
        __u32 tgid = bpf_get_current_pid_tgid() >> 32;
        if (bpf_map_lookup_elem(&late, &tgid))
            send_free(call.kind, call.out, 0, call.device, F_UNKNOWN); /* allocated before its driver's probes */
        else
            count(STAT_UNKNOWN_FREES); /* allocated before the agent started */
        return 0;
    }
    if (!call.extra)
        return 0; /* refused, and nothing was booked for it */
    if (call.extra == 1) { /* refused: the block lives on */
        struct block_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .handle = 0, .addr = call.out};
        bpf_map_update_elem(&live, &key, &call.size, BPF_NOEXIST);
    }
    send_free(call.kind, call.out, call.size, call.device, F_FAILED);
    return 0;
}

/* CPython's code_dealloc(code): a code object of a stack already sent is going away, so its address
 * may soon hold another (a notebook cell run again, exec'd or generated code): user space forgets its
 * name, and a later stack with that address gets its code record sent again. */
SEC("uprobe")
int BPF_KPROBE(code_freed, __u64 code)
{
    struct code_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .code = code};
    if (!bpf_map_lookup_elem(&codes_seen, &key))
        return 0; /* never named: nothing to forget (most code objects) */
    bpf_map_delete_elem(&codes_seen, &key);
    /* the stacks holding its address are new again: their next allocation sends the code records of
     * whatever lives there then (read now, not when user space gets to them, as freed memory may be
     * reused or stale by then) */
    struct proc *p = bpf_map_lookup_elem(&procs, &key.tgid);
    if (p)
        __sync_fetch_and_add(&p->code_epoch, 1);
    struct event *e = new_event(EV_CODE_FREED, 0, 0);
    if (e) {
        e->addr = code;
        send(e, 0);
    }
    return 0;
}

/* A VMM reference taken or dropped, for user space to count: the handle rides after the header. */
static __always_inline void send_vmm(__u32 kind, __u64 addr, __u64 size, __u64 handle, __u16 flags)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!bpf_map_lookup_elem(&procs, &tgid) && setting(SET_ONLY_REGISTERED))
        return;
    struct event *e = new_event(EV_VMM, kind, 0);
    if (!e)
        return;
    e->addr = addr;
    e->size = size;
    e->flags = flags;
    e->nframes = 1; /* the slot that carries the handle */
    e->frames[0].code = handle;
    e->frames[0].instr = 0;
    send(e, 0);
}

/* cuMemMap(ptr, size, offset, handle, flags), cuMemUnmap(ptr, size), cuMemRetainAllocationHandle(&handle,
 * addr): the kind is the attach cookie. With return probes a map or a retain is sent once it succeeded, an
 * unmap at its entry (undone, F_FAILED, if refused); entry-only probes send them all at entry (a refused one
 * is rare and changes nothing user space can match: an unknown mapping or handle). */
SEC("uprobe")
int BPF_KPROBE(vmm_enter, __u64 a0, __u64 a1, __u64 a2, __u64 a3)
{
    __u32 kind = bpf_get_attach_cookie(ctx);
    __u64 addr = kind == K_RETAIN ? a1 : a0;
    __u64 size = kind == K_RETAIN ? 0 : a1;
    __u64 handle = kind == K_MAP ? a3 : 0;
    if (setting(SET_ENTRY_ONLY)) {
        __u64 ret;
        entering(ctx, 0, 0, &ret);
        send_vmm(kind, addr, size, handle, 0);
    } else {
        stash(kind, addr, size, handle, DEVICE_CUDA);
        if (kind == K_UNMAP) /* a reference dropped takes effect when the call is made, as a free does */
            send_vmm(kind, addr, size, handle, 0);
    }
    return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(vmm_exit, long rc)
{
    struct inflight call;
    if (!returning(&call))
        return 0;
    if (call.kind != K_UNMAP && rc == 0)
        send_vmm(call.kind, call.out, call.size, call.extra, 0);
    else if (call.kind == K_UNMAP && rc != 0)
        send_vmm(call.kind, call.out, call.size, call.extra, F_FAILED); /* refused: the mapping holds on */
    return 0;
}

/* cuInit: a process about to use the driver; user space registers it before its first allocation. */
SEC("uprobe")
int BPF_KPROBE(init_enter)
{
    if (setting(SET_ENTRY_ONLY)) {
        __u64 ret;
        entering(ctx, 0, 1, &ret);
    }
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    announce(tgid, bpf_map_lookup_elem(&procs, &tgid));
    return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(process_exit, struct task_struct *task)
{
    __u64 id = bpf_get_current_pid_tgid();
    __u32 tgid = id >> 32;
    /* the thread's task storage goes with its task */
    if (BPF_CORE_READ(task, signal, live.counter) != 0)
        return 0; /* other threads of the process still run */
    bpf_map_delete_elem(&announced, &tgid);
    bpf_map_delete_elem(&late, &tgid);
    struct proc *p = bpf_map_lookup_elem(&procs, &tgid);
    if (!p)
        return 0;
    bpf_map_delete_elem(&procs, &tgid);
    struct event *e = new_event(EV_EXIT, 0, 1);
    if (e)
        send(e, 1);
    return 0;
}

#define PROT_EXEC 4
#define LIBCUDA_PREFIX "libcuda.so"

/* Whether *file*'s name starts with libcuda.so: a driver file (its mapping, or its open by the loader). */
static __always_inline int driver_named(struct file *file)
{
    char name[sizeof(LIBCUDA_PREFIX)] = {};
    bpf_probe_read_kernel_str(name, sizeof(name), BPF_CORE_READ(file, f_path.dentry, d_name.name));
    const char want[] = LIBCUDA_PREFIX;
#pragma unroll
    for (int i = 0; i < (int)sizeof(LIBCUDA_PREFIX) - 1; i++)
        if (name[i] != want[i])
            return 0;
    return 1;
}

/* A process has just mapped a libcuda file executable (the dynamic loader maps its code): user space
 * probes a file it has not probed yet at once, before the process's first driver call in most cases
 * (a real driver's cuInit alone takes far longer), rather than at its next rescan. */
SEC("fexit/vm_mmap_pgoff")
int BPF_PROG(driver_mapped, struct file *file, unsigned long addr, unsigned long len, unsigned long prot,
             unsigned long flag, unsigned long pgoff, unsigned long ret)
{
    if (!file || !(prot & PROT_EXEC) || ret >= (unsigned long)-4095 || !driver_named(file))
        return 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (setting(SET_ONLY_REGISTERED) && !bpf_map_lookup_elem(&procs, &tgid))
        return 0;
    struct event *e = new_event(EV_DRIVER, 0, 1);
    if (e)
        send(e, 1);
    return 0;
}

/* A fork child of a registered process has the same memory layout: register it here, before it runs. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(process_fork, struct task_struct *parent, struct task_struct *child)
{
    __u32 ptgid = BPF_CORE_READ(parent, tgid);
    __u32 ctgid = BPF_CORE_READ(child, tgid);
    if (ctgid == ptgid)
        return 0; /* a new thread, not a new process */
    struct proc *p = bpf_map_lookup_elem(&procs, &ptgid);
    if (!p)
        return 0;
    struct proc copy = *p;
    bpf_map_update_elem(&procs, &ctgid, &copy, BPF_NOEXIST);
    struct event *e = new_event(EV_FORK, 0, 1);
    if (e) {
        e->addr = ctgid;
        send(e, 1);
    }
    return 0;
}

/* exec replaces the image: what we knew of the process is void. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(process_exec, struct task_struct *task)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    bpf_map_delete_elem(&procs, &tgid);
    bpf_map_delete_elem(&announced, &tgid);
    bpf_map_delete_elem(&late, &tgid);
    struct event *e = new_event(EV_EXEC, 0, 1);
    if (e)
        send(e, 1);
    return 0;
}

/* the hold's settings and the agent's sign of life (user space writes them) */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct hold_state);
} hold SEC(".maps");

/* driver files probed (user space adds them): their opens need no word */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, struct file_key);
    __type(value, __u8);
} probed_files SEC(".maps");

/* tgid -> when it was stopped: user space (the agent, else its resumer at the bound) resumes it and deletes it */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, MAX_PROCS);
    __type(key, __u32);
    __type(value, __u64);
} held SEC(".maps");

/* Stop the process that has just opened a driver file not probed yet (the whole process: SIGSTOP stops every
 * thread), if the hold is on and safe now (agent.h); whether it was. It stops on its way back to user space,
 * before the loader can map the file. */
static __always_inline int hold_now(struct task_struct *task, __u32 tgid)
{
    __u32 zero = 0;
    struct hold_state *h = bpf_map_lookup_elem(&hold, &zero);
    if (!h || !h->enabled || tgid == h->agent_tgid)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    if (h->alive_ns + HOLD_ALIVE_NS < now || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > HOLD_BACKLOG_BYTES)
        return 0;
    if (BPF_CORE_READ(task, ptrace) || BPF_CORE_READ(task, signal, tty))
        return 0;
    if (bpf_map_update_elem(&held, &tgid, &now, BPF_NOEXIST))
        return 0; /* held already (another of its threads), or the map is full */
    if (bpf_send_signal(SIGSTOP_NR)) {
        bpf_map_delete_elem(&held, &tgid);
        return 0;
    }
    return 1;
}

/* x86-64 system call numbers of the opens the dynamic loader (and anyone) may use */
#define NR_OPEN 2
#define NR_OPENAT 257
#define NR_OPENAT2 437
/* open flags (octal, as in fcntl.h): the dynamic loader opens a library O_RDONLY | O_CLOEXEC */
#define OPEN_ACCMODE 03
#define OPEN_NONBLOCK 04000
#define OPEN_PATH 010000000

/* A process has just opened a file named libcuda.so* as descriptor *ret*: the dynamic loader opens a library
 * before it maps it, so user space can put the probes on that file (a uprobe sits on the inode: it is in every
 * mapping made after, and in those before) ahead of its mapping, from the descriptor this sends (addr), rather
 * than after (driver_mapped) or at a rescan. */
static __always_inline int opened(long ret)
{
    if (ret < 0 || ret > 0x7fffffff)
        return 0;
    struct task_struct *task = bpf_get_current_task_btf();
    struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
    if (!fdt || (__u32)ret >= BPF_CORE_READ(fdt, max_fds))
        return 0;
    struct file **fds = BPF_CORE_READ(fdt, fd);
    struct file *file = 0;
    if (bpf_probe_read_kernel(&file, sizeof(file), &fds[ret]) || !file)
        return 0;
    __u32 fflags = BPF_CORE_READ(file, f_flags);
    if ((fflags & OPEN_ACCMODE) || (fflags & (OPEN_NONBLOCK | OPEN_PATH)))
        return 0; /* not as a loader opens: a writer (a linker, a copy), or a reader such as an agent's */
    if (!driver_named(file))
        return 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (setting(SET_ONLY_REGISTERED) && !bpf_map_lookup_elem(&procs, &tgid))
        return 0;
    struct file_key fk = {.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev), .ino = BPF_CORE_READ(file, f_inode, i_ino)};
    if (bpf_map_lookup_elem(&probed_files, &fk))
        return 0; /* probed already: nothing to do */
    struct event *e = new_event(EV_DRIVER_OPENED, 0, 1);
    if (!e)
        return 0;
    e->addr = ret;
    e->size = fk.ino;
    e->seq = fk.dev;
    if (hold_now(task, tgid))
        e->flags = F_HELD;
    send(e, 1);
    return 0;
}

/* opened() where the kernel has BPF trampolines: only opens pay for it (do_sys_openat2 serves open, openat and
 * openat2) */
SEC("fexit/do_sys_openat2")
int BPF_PROG(driver_opened_fx, int dfd, const char *filename, struct open_how *how, long ret)
{
    return opened(ret);
}

/* opened() elsewhere: a raw tracepoint (no trampoline, no tracefs). It runs at every system call's exit, and
 * while attached every system call of the machine takes the kernel's traced path (BENCHMARKS.md: the cost);
 * it leaves at once unless the call is an open. */
SEC("tp_btf/sys_exit")
int BPF_PROG(driver_opened, struct pt_regs *regs, long ret)
{
    long nr = BPF_CORE_READ(regs, orig_ax);
    if (nr != NR_OPENAT && nr != NR_OPEN && nr != NR_OPENAT2)
        return 0;
    return opened(ret);
}
