/* A stand-in libcuda.so.1 for gpuflame's agent tests: NOT NVIDIA's driver.
 *
 * There is no GPU and no driver on the test machines, so this library gives
 * the agent something to put its uprobes on: the real signatures from the
 * CUDA toolkit's cuda.h (so symbol names and argument registers are the real
 * ones: cuMemAlloc is cuMemAlloc_v2, ...), handing out fake device addresses
 * and handles that nothing can dereference. A free of an address it never
 * handed out fails, as the real driver's does; a size of 0 fails, and so
 * does one at or above 1 PiB (out of memory).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

const char gpuflame_standin_libcuda[] = "gpuflame test stand-in for libcuda.so.1: fake addresses, no GPU";

#define HANDLE_TAG (1ull << 62)
#define HOST_TAG (1ull << 61)
#define SLOTS (1u << 20)
#define HUGE ((size_t)1 << 50)
static uint64_t live[SLOTS]; /* open addressing; 0 = empty, 1 = deleted */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_address = 0x7f0000000000ull;
static uint64_t next_handle = 0x1000;
static int initialized;
/* gpuflame_standin_reuse(1): device addresses freed are handed out again at once, last freed first (as a
 * real allocator reuses them), and a free waits after releasing its block, before it returns, so that another
 * thread's allocation gets the address while the free is still in flight (a real driver may hand an address
 * out again before its free has returned) */
#define REUSE_SLOTS 4096
static uint64_t reusable[REUSE_SLOTS];
static unsigned n_reusable;
static int reuse;
static uint64_t handed_out; /* allocations handed out so far (a free in flight waits for the next) */

void gpuflame_standin_reuse(int on) { reuse = on; }
/* gpuflame_standin_refuse(1): every free, release and unmap fails and keeps what it would drop, as in a
 * context with a sticky error */
static int refuse;
void gpuflame_standin_refuse(int on) { refuse = on; }

static uint64_t slot_of(uint64_t key) { return (key * 0x9e3779b97f4a7c15ull) >> 44; }

static int remember(uint64_t key) {
    for (uint64_t i = slot_of(key), n = 0; n < SLOTS; i = (i + 1) & (SLOTS - 1), n++)
        if (live[i] <= 1) { live[i] = key; return 1; }
    return 0;
}

static int forget(uint64_t key) {
    for (uint64_t i = slot_of(key), n = 0; n < SLOTS && live[i]; i = (i + 1) & (SLOTS - 1), n++)
        if (live[i] == key) { live[i] = 1; return 1; }
    return 0;
}

static CUresult hand_out(uint64_t *out, size_t size, uint64_t *counter, uint64_t tag) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (size >= HUGE) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    uint64_t at;
    if (reuse && tag == 0 && n_reusable) {
        at = reusable[--n_reusable];
    } else {
        at = *counter;
        *counter += (size + 511) & ~(uint64_t)511;
    }
    int ok = remember(at | tag);
    __atomic_add_fetch(&handed_out, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
    if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = at;
    return CUDA_SUCCESS;
}

/* The free in flight after releasing its block: it waits (spinning, bounded: a few tens of microseconds) until
 * another allocation has been handed out, which with reuse on takes the address just freed (last freed first).
 * A spin, not sched_yield(): beside busy loops on a loaded machine each yield waits out their time slices. */
#define HAND_OUT_SPINS 500

static void wait_for_a_hand_out(uint64_t seen) {
    for (int i = 0; i < HAND_OUT_SPINS && __atomic_load_n(&handed_out, __ATOMIC_ACQUIRE) == seen; i++)
        __builtin_ia32_pause();
}

static CUresult take_back(uint64_t key) {
    if (refuse) return CUDA_ERROR_ILLEGAL_ADDRESS;
    uint64_t seen = __atomic_load_n(&handed_out, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&lock);
    int ok = forget(key);
    if (ok && reuse && !(key & (HANDLE_TAG | HOST_TAG)) && n_reusable < REUSE_SLOTS)
        reusable[n_reusable++] = key;
    pthread_mutex_unlock(&lock);
    if (ok && reuse) /* released: another thread's allocation takes the address before this free returns */
        wait_for_a_hand_out(seen);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}


static void vmm_hold(uint64_t handle);

CUresult CUDAAPI cuInit(unsigned int Flags) { (void)Flags; initialized = 1; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
    return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream; return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    (void)pool; (void)hStream; return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    (void)flags; return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
/* The pitch is rounded up to 512 bytes, as a real device's texture alignment would. */
CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                 unsigned int ElementSizeBytes) {
    (void)ElementSizeBytes;
    if (!pPitch) return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    CUresult rc = hand_out((uint64_t *)dptr, pitch * Height, &next_address, 0);
    if (rc == CUDA_SUCCESS) *pPitch = pitch;
    return rc;
}
CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
    (void)flags;
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    uint64_t h;
    CUresult rc = hand_out(&h, size, &next_handle, HANDLE_TAG);
    if (rc == CUDA_SUCCESS) { *handle = h; vmm_hold(h); }
    return rc;
}
CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize) {
    return hand_out((uint64_t *)pp, bytesize, &next_address, HOST_TAG);
}
CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    (void)Flags; return hand_out((uint64_t *)pp, bytesize, &next_address, HOST_TAG);
}
/* What cuda.h maps the async calls to under CUDA_API_PER_THREAD_DEFAULT_STREAM (its _ptsz entry points;
 * not declared without that macro, so their signatures are spelled out here as cuda.h has them). */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream; return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream) {
    (void)pool; (void)hStream; return hand_out((uint64_t *)dptr, bytesize, &next_address, 0);
}
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { (void)hStream; return take_back(dptr); }
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) { return take_back(dptr); }
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { (void)hStream; return take_back(dptr); }
/* VMM as the driver counts it: a cuMemCreate allocation lives while its handle (cuMemCreate's, and each
 * cuMemRetainAllocationHandle's) or a mapping (cuMemMap) holds it; cuMemRelease and cuMemUnmap drop one. */
#define VMM_SLOTS 1024
static struct { uint64_t handle; int refs; } held[VMM_SLOTS];
static struct { uint64_t va, size, handle; } mapped[VMM_SLOTS];

static int held_slot(uint64_t handle) {
    for (int i = 0; i < VMM_SLOTS; i++)
        if (held[i].refs && held[i].handle == handle) return i;
    return -1;
}

static CUresult vmm_drop(int slot) {
    uint64_t handle = held[slot].handle;
    if (--held[slot].refs) return CUDA_SUCCESS;
    return take_back(handle | HANDLE_TAG);
}

static void vmm_hold(uint64_t handle) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < VMM_SLOTS; i++)
        if (!held[i].refs) { held[i].handle = handle; held[i].refs = 1; break; }
    pthread_mutex_unlock(&lock);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
    if (refuse) return CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_mutex_lock(&lock);
    int slot = held_slot(handle);
    pthread_mutex_unlock(&lock);
    return slot < 0 ? CUDA_ERROR_INVALID_VALUE : vmm_drop(slot);
}
CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
    (void)offset; (void)flags;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int slot = held_slot(handle);
    for (int i = 0; slot >= 0 && i < VMM_SLOTS; i++)
        if (!mapped[i].size) {
            mapped[i].va = ptr; mapped[i].size = size; mapped[i].handle = handle;
            held[slot].refs++;
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (refuse) return CUDA_ERROR_ILLEGAL_ADDRESS;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < VMM_SLOTS; i++)
        if (mapped[i].size && mapped[i].va == ptr && mapped[i].size == size) {
            int slot = held_slot(mapped[i].handle);
            mapped[i].size = 0;
            pthread_mutex_unlock(&lock);
            return slot < 0 ? CUDA_ERROR_INVALID_VALUE : vmm_drop(slot);
        }
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < VMM_SLOTS; i++)
        if (mapped[i].size && mapped[i].va <= (uint64_t)addr && (uint64_t)addr < mapped[i].va + mapped[i].size) {
            int slot = held_slot(mapped[i].handle);
            if (slot >= 0) { held[slot].refs++; *handle = mapped[i].handle; rc = CUDA_SUCCESS; }
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult CUDAAPI cuMemFreeHost(void *p) { return take_back((uint64_t)p | HOST_TAG); }
