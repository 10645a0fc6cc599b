/* Shared by agent.bpf.c and (as struct formats) gpuflame/agent/events.py: keep both in step. */
#ifndef GPUFLAME_AGENT_H
#define GPUFLAME_AGENT_H

#define RING_BYTES 16777216 /* 16 MiB */
#define WAKE_BYTES (256 * 1024)
#define OUTPUT_TRIES 128 /* a record the ring refused while not full: tried this many times in all */
#define MAX_PROCS 16384
/* Python threads searched for the caller's thread state (the interpreter lists the newest first, so a
 * server's pool hides the main thread behind it); once per thread (cached, re-checked at each use), two
 * reads a thread: ~3 ms at the bound */
#define MAX_THREADS 16384
#define THREAD_CHUNK 256 /* threads a call of search_threads reads (the verifier checks it once) */
#define MAX_FRAMES 128 /* Python frames kept per allocation */
#define MAX_WALK 160   /* frames visited (C-stack shim frames are skipped) */
#define MAX_NATIVE 64
#define STACK_WORDS (MAX_FRAMES * 2 + MAX_NATIVE)
#define FRAME_BYTES 104 /* of each frame: every field the walk needs is below */
/* The walk reads the frames a page at a time (WINDOW_BYTES, x86-64's page): from the start of the page of
 * the frame it needs to that frame's end. A thread's interpreter frames (3.11+) lie one below the other in
 * its data stack, so one read holds many (a read per frame was most of the walk's cost); a frame outside
 * the window is read anew with its own page. The window never reaches below the page of a frame: that
 * memory may be unmapped or untouched, and a read that faults costs more than the walk. */
#define WINDOW_BYTES 4096
#define RAW_U64_MASK 0x78
#define RAW_U32_MASK 0x7c
#define RAW_U8_MASK 0x7f

/* kinds: which driver function */
#define K_ALLOC 0
#define K_ALLOC_ASYNC 1
#define K_ALLOC_POOL_ASYNC 2
#define K_ALLOC_MANAGED 3
#define K_ALLOC_PITCH 4
#define K_CREATE 5
#define K_ALLOC_HOST 6
#define K_HOST_ALLOC 7
#define K_FREE 8
#define K_FREE_ASYNC 9
#define K_RELEASE 10
#define K_FREE_HOST 11
/* VMM references (cuMemCreate's memory lives while a handle or a mapping holds it) */
#define K_MAP 12    /* cuMemMap(ptr, size, offset, handle, flags) */
#define K_UNMAP 13  /* cuMemUnmap(ptr, size) */
#define K_RETAIN 14 /* cuMemRetainAllocationHandle(&handle, addr): one more handle on what addr maps */

/* event types */
#define EV_ALLOC 1
#define EV_FREE 2
#define EV_EXIT 3
#define EV_NEW_PROCESS 4
#define EV_FORK 5
#define EV_EXEC 6
#define EV_CODE 7 /* what naming a code object needs, sent with a new stack */
/* entry-only probes (--probes entry): an EV_ALLOC flagged F_PENDING is sent at the call's entry, its
 * outcome later as an EV_RESULT; EV_SITE: a return address user space may put a plain uprobe on */
#define EV_RESULT 8
#define EV_SITE 9
#define EV_VMM 11 /* a VMM reference taken or dropped: kind K_MAP/K_UNMAP/K_RETAIN, addr, size, then the handle */
#define EV_CODE_FREED 12 /* a code object named in a stack sent was deallocated: its address may hold another */
#define EV_DRIVER 10 /* a process mapped a libcuda file executable: user space probes it now, not at a rescan */

/* event flags */
#define F_NOT_REGISTERED 1 /* no interpreter known for the process (yet) */
#define F_NO_THREAD 2      /* the thread has no PyThreadState */
#define F_TRUNCATED 4      /* deeper than MAX_FRAMES */
#define F_UNTRACKED 8      /* the live-block map was full: its free will not be seen */
#define F_PENDING 16       /* entry-only: the call has not returned; an EV_RESULT (same tid, seq) follows */
#define F_FAILED 32        /* EV_RESULT: the call failed (or its output was unchanged): nothing allocated;
                            * EV_FREE, EV_VMM (K_UNMAP): the driver refused the call booked at its entry: undo it */
#define F_RETURNED 64      /* EV_RESULT: read at the call's return site (exact), not at the next entry */
#define F_UNKNOWN 128      /* EV_RESULT: not read at the return site, and the output's memory may hold
                            * something else by now (heap, or a frame that returned): not counted;
                            * EV_FREE: a block never seen, freed by a process in `late` (its allocation was
                            * made before the probes of the driver file it loaded were in) */
#define F_REPLACED 256     /* EV_ALLOC: the live map still held its address: its free was missed (frees are
                            * sent at their entry, ahead of any allocation of the address they release) */

/* device: an ordinal, or one of these */
#define DEVICE_CUDA -1 /* the context's device, not known from the call */
#define DEVICE_HOST -2

/* proc flags */
#define P_NATIVE 1

/* stats (per-CPU counters) */
#define STAT_LOST_EVENTS 0
#define STAT_LIVE_FULL 1
#define STAT_UNKNOWN_FREES 2
#define STAT_CALLS_FULL 3
#define STAT_RING_REFUSED 4 /* of the lost events, those refused OUTPUT_TRIES times with the ring not full */
#define STAT_LOST_ALLOCS 5      /* of the lost events, allocations (or entry-only results of one) */
#define STAT_LOST_ALLOC_BYTES 6 /* their sizes */
#define STAT_LOST_FREES 7       /* of the lost events, frees (and VMM references dropped) */
#define STAT_FRAME_READS 8      /* user-memory reads the frame walk made (a page or less each): not a loss */
#define N_STATS 9

/* settings */
#define SET_ONLY_REGISTERED 0 /* 1 = only processes in procs (--pid), 0 = every process */
#define SET_ENTRY_ONLY 1      /* 1 = no uretprobes: allocations recorded at entry, results read back later */
#define SET_LIVE_OVERFLOWED 2 /* set by the kernel side once the live map was full: unknown frees are sent */
#define N_SETTINGS 3
#define STACK_SPAN (8 << 20) /* an output pointer this close above the stack pointer is on the stack */

struct py_offsets {
    __s32 runtime_interp_head;
    __s32 interp_threads_head;
    __s32 tstate_next;
    __s32 tstate_native_thread_id;
    __s32 tstate_thread_id;
    __s32 tstate_cframe;
    __s32 cframe_current_frame;
    __s32 tstate_frame;
    __s32 frame_previous;
    __s32 frame_code;
    __s32 frame_instr;
    __s32 frame_instr_size;
    __s32 frame_owner;
    __s32 owner_cstack;
};

/* where a code object keeps its name, file, first line and line table (3.10: co_name) */
struct code_offsets {
    __s32 code_name;
    __s32 code_filename;
    __s32 code_firstlineno;
    __s32 code_linetable;
    __s32 unicode_state;
    __s32 unicode_length;
    __s32 unicode_ascii_data;
    __s32 unicode_compact_data;
    __s32 bytes_size;
    __s32 bytes_data;
};

struct proc {
    __u64 runtime; /* address of _PyRuntime in the process; 0: not Python */
    __u32 flags;
    __u32 code_epoch; /* code objects of sent stacks freed so far: part of each stack's hash */
    struct py_offsets off;
    struct code_offsets code;
};

#define CODE_NAME_BYTES 128
#define CODE_FILE_BYTES 256
#define CODE_TABLE_BYTES 1024

/* A code object's naming data, copied when it first appears in a new stack, so
 * that it is named even if the process exits before user space reads it. */
struct code_record {
    __u8 type; /* EV_CODE */
    __u8 pad0[3];
    __u32 tgid;
    __u64 code;
    __s32 firstlineno;
    __u32 name_state; /* the str objects' state words (kind, compact, ascii) */
    __u32 file_state;
    __u32 name_len; /* characters */
    __u32 file_len;
    __u32 table_len; /* bytes */
    char name[CODE_NAME_BYTES];
    char file[CODE_FILE_BYTES];
    __u8 table[CODE_TABLE_BYTES];
};

struct code_key {
    __u32 tgid;
    __u32 pad;
    __u64 code;
};

struct block_key {
    __u32 tgid;
    __u32 handle; /* 1: a cuMemCreate handle, 0: an address */
    __u64 addr;
};

struct stack_key {
    __u32 tgid;
    __u32 pad;
    __u64 hash;
};

struct inflight {
    __u32 kind;
    __s32 device;
    __u64 out;
    __u64 size;
    __u64 extra;
    __u64 before; /* entry-only: *out at entry (unchanged later: the call failed or has not returned) */
    __u64 sp;     /* entry-only: the stack pointer at entry (at the return site it is 8 more) */
};

struct thread_state {
    struct inflight call;
    __u64 tstate;    /* its PyThreadState, re-checked at each use */
    __u64 last_hash; /* of its last allocation's stack */
    __u32 in_call;
    __u32 pending; /* entry-only: an allocation whose result is not read yet */
    __u32 seq;     /* entry-only: numbers this thread's allocations (EV_ALLOC and EV_RESULT carry it) */
    __u32 tid;    /* the global thread id the namespaced one below was read for (exec changes both) */
    __u32 ns_tid; /* its thread id in its own pid namespace (3.11+'s native_thread_id) */
    __u32 pad2;
};

struct site_key {
    __u32 tgid;
    __u32 pad;
    __u64 addr;
};

struct py_frame {
    __u64 code;
    __u64 instr;
};

#define EVENT_HEADER_FIELDS \
    __u8 type;       \
    __u8 kind;       \
    __u16 nframes;   \
    __u16 nnative;   \
    __u16 flags;     \
    __u32 tgid;      \
    __u32 tid;       \
    __u64 addr;      \
    __u64 size;      \
    __u64 ts;        \
    __s32 device;    \
    __u32 seq;       \
    char comm[16];
/* a pending EV_ALLOC (F_PENDING): addr is where the driver will write its output; seq numbers the
 * thread's allocations, and its EV_RESULT carries the same */

struct event_header {
    EVENT_HEADER_FIELDS
};

struct event {
    EVENT_HEADER_FIELDS
    struct py_frame frames[MAX_FRAMES + MAX_NATIVE / 2];
};

/* a process opened a file named libcuda.so* (addr: the descriptor, size: its inode): user space probes it
 * before the process maps it */
#define EV_DRIVER_OPENED 13

/* The hold (--hold-late-drivers): a process that opens a driver file not probed yet is stopped (SIGSTOP) until
 * the agent has probed it and sent SIGCONT, or until the bound (the agent's resumer process). Never while the
 * agent's reader has not shown life for HOLD_ALIVE_NS, nor while the ring holds HOLD_BACKLOG_BYTES unread (the
 * word would wait behind them), nor a process with a controlling terminal (its shell would take a stop for
 * the user's) or one being traced (its tracer would see the stop). */
#define HOLD_ALIVE_NS 2000000000ULL
#define HOLD_BACKLOG_BYTES (1 << 20)
#define F_HELD 512 /* EV_DRIVER_OPENED: the process was sent SIGSTOP; it is in `held` until resumed */
#define SIGSTOP_NR 19

struct hold_state {
    __u64 alive_ns;   /* the agent's reader's last sign of life (bpf_ktime_get_ns's clock: CLOCK_MONOTONIC) */
    __u32 enabled;    /* 1: hold */
    __u32 agent_tgid; /* never held: it opens driver files to read them */
};

struct file_key {
    __u32 dev; /* the kernel's dev_t of its filesystem: major << 20 | minor */
    __u32 pad;
    __u64 ino;
};

#endif
