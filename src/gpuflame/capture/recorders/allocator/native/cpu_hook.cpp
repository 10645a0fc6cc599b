// gpuflame's CPU allocator hook: every allocation PyTorch makes through its
// CPU allocator, with the Python stack that asked for it.
//
// Why an allocator and not a dispatch mode: a TorchDispatchMode costs a trip
// through Python for every aten operation, allocating or not; this costs a
// stack walk in C for each allocation only. It also sees what a dispatch
// mode cannot: workspaces and temporaries a kernel allocates and frees
// inside one operation, storages made without an operator.
//
// The hook wraps the allocator that was installed (normally PyTorch's
// DefaultCPUAllocator). Its data pointers keep the wrapped allocator's
// contract (context == data), so the "raw" allocate/deallocate interface
// still works; only the deleter differs, and it hands the memory back to
// the wrapped allocator's deleter after booking the free. Storages that
// PyTorch makes with its default allocator by name (torch.UntypedStorage(n),
// so copy.deepcopy of a tensor) go through the hook too: see DefaultShim.
//
// Locking: one mutex guards the books. It is never held while Python runs
// or while waiting for the GIL, so frees (any thread, no GIL) and the
// garbage collector (which may free tensors while we build Python objects)
// cannot deadlock with it.
//
// The hook object is never destroyed: storages it made may outlive
// stop(), the module and even the interpreter, and their deleter must still
// find it.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

// CPython 3.11: the calling thread's frames can be read without the GIL (see
// walk_own_frames). Other versions take the GIL and use the public frame API.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define GPUFLAME_OWN_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// A Python frame is (code object, byte offset of the instruction); a native
// frame (--native) is (nullptr, return address).
using FrameKey = std::pair<PyObject*, int64_t>;
using StackKey = std::vector<FrameKey>;  // leaf first: native frames, then Python frames

struct StackHash {
  size_t operator()(const StackKey& s) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (const auto& f : s) {
      h ^= reinterpret_cast<uintptr_t>(f.first) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h ^= static_cast<uint64_t>(static_cast<uint32_t>(f.second)) + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct Live {
  uint64_t nbytes;
  uint64_t seq;
  uint32_t site;
  uint8_t tag = 0;  // category found in the object graph (capture/books/categories.py: TAGGED), 0: none
  uint64_t event = UINT64_MAX;  // its allocation's number in the history (HistoryBooks::note), to retag it
};

// tagged blocks live at the peak and freed since, per (site, tag), stamped
// with the peak they belong to (a later peak makes the entry stale)
struct GoneTagged {
  uint64_t peak_seq = 0, bytes = 0, count = 0;
};

struct SiteBooks {
  uint64_t alloc_bytes = 0, alloc_count = 0;
  uint64_t inuse_bytes = 0, inuse_count = 0;
  uint64_t gone_bytes = 0, gone_count = 0;  // live at the peak, freed since
  uint64_t joint_gone_bytes = 0, joint_gone_count = 0;  // live at the joint mark, freed since
};

// -- the joint peak of a run's processes: one shared table per device --------------
//
// Each process's own peak is exact, but the processes of a run reach theirs
// at different moments, so their sum may never have happened. `gpuflame run`
// gives every process one session folder; there, one small file per device
// is mapped by every process that records that device. It holds the live
// bytes of each process (a slot each), their sum, the highest sum so far and
// an epoch counted up each time the highest sum rises. Every booked event
// publishes its size; the event that raises the highest sum bumps the epoch.
// A process does not need to be told when another one raises it: its books
// do not change until its own next event, so before applying that event (or
// at a snapshot) it sees the epoch moved and marks its books "as at that
// epoch" -- the same lazy trick as its own peak: blocks live at the mark plus
// those freed since. A merge takes, for the last epoch, each process's mark.
//
// One spin lock in the table makes "look at the epoch, apply the event,
// publish it" one step across processes. It is held for a few instructions;
// a holder that died is detected by its pid; a lock that cannot be had in
// two seconds makes this process stop using the table (its profile then
// has no joint mark, and the merge says what its number is instead). A
// process that dies without leaving keeps its bytes in the sum until the
// next process joins (which frees the slots of dead pids); the merge sees
// that the shares do not add up to the highest total and says so.

constexpr uint64_t kTableMagic = 0x31766b6165706667ULL;  // "gfpeakv1"
constexpr uint32_t kTableSlots = 1024;
constexpr uint64_t kNotSeen = UINT64_MAX;

struct TableSlot {
  int32_t pid;  // 0: free
  uint32_t unused;
  uint64_t total;  // live bytes this process published
};

struct TableHeader {
  std::atomic<uint32_t> lock;  // 0: free; else the holder's pid
  uint32_t used;               // slots handed out since the table started afresh
  uint64_t magic;
  uint64_t generation;  // new each time the table starts afresh (no process of it alive)
  uint64_t total, max, epoch;
  TableSlot slots[kTableSlots];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the table lock must be address-free");

int32_t g_pid = static_cast<int32_t>(getpid());  // refreshed in fork children

struct Joint {  // this process's side of one table
  std::string path;
  TableHeader* t = nullptr;
  int slot = -1;  // -1: not publishing (not joined, retired, a fork child not rejoined, broken)
  uint64_t seen = kNotSeen;  // the epoch this process last saw
  uint64_t seen_max = 0;
  uint64_t generation = 0;
  bool broken = false;
};

std::vector<Joint*>* g_joints = nullptr;  // handle -> table; never freed (other processes map them)

bool alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

bool lock_table(Joint& j) {
  if (j.broken) return false;
  auto& lock = j.t->lock;
  auto me = static_cast<uint32_t>(g_pid);
  uint32_t holder = 0;
  if (lock.compare_exchange_strong(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) return true;
  auto started = std::chrono::steady_clock::now();
  for (uint64_t i = 1;; ++i) {
    holder = 0;
    if (lock.compare_exchange_weak(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) return true;
    if (i < 128) continue;
    if ((i & 63) == 0 && holder != 0) {
      if (!alive(static_cast<int32_t>(holder)) &&
          lock.compare_exchange_strong(holder, me, std::memory_order_acquire, std::memory_order_relaxed)) {
        return true;  // its holder died holding it
      }
      if (std::chrono::steady_clock::now() - started > std::chrono::seconds(2)) {
        j.broken = true;
        j.slot = -1;
        return false;
      }
    }
    sched_yield();
  }
}

void unlock_table(Joint& j) { j.t->lock.store(0, std::memory_order_release); }

// Whether the highest total rose since this process last looked (then its
// books, unchanged since, are its share at that epoch). Under the lock.
bool table_moved(Joint& j) {
  if (j.t->epoch == j.seen) return false;
  j.seen = j.t->epoch;
  j.seen_max = j.t->max;
  return true;
}

// This process's live bytes changed by *delta*; true when that raised the
// highest total (a new epoch: mark after the event). Under the lock.
bool table_publish(Joint& j, int64_t delta) {
  TableHeader* t = j.t;
  t->slots[j.slot].total += static_cast<uint64_t>(delta);
  t->total += static_cast<uint64_t>(delta);
  if (t->total <= t->max) return false;
  t->max = t->total;
  t->epoch += 1;
  j.seen = t->epoch;
  j.seen_max = t->max;
  return true;
}

// Take a slot (under the lock). Slots of processes that died are freed first;
// when no process of the table is alive, it starts afresh as a new generation:
// what comes now cannot have overlapped what came before.
bool table_join(Joint& j) {
  TableHeader* t = j.t;
  bool anyone = false;
  if (t->magic == kTableMagic) {
    for (uint32_t i = 0; i < t->used && i < kTableSlots; ++i) {
      TableSlot& s = t->slots[i];
      if (s.pid == 0) continue;
      if (s.pid != g_pid && !alive(s.pid)) {
        t->total -= s.total;
        s.pid = 0;
        s.total = 0;
        continue;
      }
      anyone = true;
    }
  }
  if (!anyone) {
    auto now = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    t->magic = kTableMagic;
    t->generation = (now * 0x9e3779b97f4a7c15ULL) ^ (static_cast<uint64_t>(g_pid) << 20) ^ t->generation;
    t->total = t->max = t->epoch = 0;
    t->used = 0;
  }
  uint32_t i = 0;
  while (i < t->used && t->slots[i].pid != 0) ++i;
  if (i >= kTableSlots) return false;
  if (i == t->used) t->used += 1;
  t->slots[i].pid = g_pid;
  t->slots[i].total = 0;
  j.slot = static_cast<int>(i);
  j.generation = t->generation;
  j.seen = kNotSeen;  // the first look marks: an empty share at the epoch it joins in
  return true;
}

// Leave: this process's bytes stop counting. Under the lock; the caller marks first if the epoch moved.
void table_leave(Joint& j) {
  TableSlot& s = j.t->slots[j.slot];
  j.t->total -= s.total;
  s.pid = 0;
  s.total = 0;
  j.slot = -1;
}

// Join (again) with an empty share: a new window, or a fork child (whose books start empty).
// Takes the lock itself.
bool table_rejoin(Joint& j) {
  if (!lock_table(j)) return false;
  if (j.slot >= 0) table_leave(j);
  bool ok = table_join(j);
  unlock_table(j);
  return ok;
}

void joints_after_fork_child() {
  g_pid = static_cast<int32_t>(getpid());
  if (g_joints == nullptr) return;
  for (Joint* j : *g_joints) j->slot = -1;  // the parent's slots are the parent's; rejoin explicitly
}

// Give the table file real blocks before anyone maps it: a file only sized
// (ftruncate) has none, and on a full filesystem the first store through the
// mapping kills the program with SIGBUS. posix_fallocate reserves them; where
// the filesystem cannot, zeros are written past the end. Under flock, so a
// process extending the file never writes zeros over a table another process
// already uses. 0, or the errno of what failed.
int reserve_table(int fd) {
  while (flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) return errno;
  }
  int err = posix_fallocate(fd, 0, sizeof(TableHeader));
  if (err == EOPNOTSUPP || err == EINVAL) {
    struct stat st {};
    err = fstat(fd, &st) != 0 ? errno : 0;
    static const char zeros[4096] = {};
    for (off_t at = st.st_size; err == 0 && at < static_cast<off_t>(sizeof(TableHeader));) {
      size_t n = std::min(sizeof(zeros), sizeof(TableHeader) - static_cast<size_t>(at));
      ssize_t wrote = pwrite(fd, zeros, n, at);
      if (wrote > 0) at += wrote;
      else if (wrote == 0) err = ENOSPC;
      else if (errno != EINTR) err = errno;
    }
  }
  flock(fd, LOCK_UN);
  return err;
}

// The table at *path*, mapped (created when missing); its handle.
int open_table(const std::string& path) {
  if (g_joints == nullptr) {
    g_joints = new std::vector<Joint*>();
    pthread_atfork(nullptr, nullptr, joints_after_fork_child);
  }
  for (size_t i = 0; i < g_joints->size(); ++i) {
    if ((*g_joints)[i]->path == path) return static_cast<int>(i);
  }
  // never through a link, never blocking on a FIFO, and only a regular file of this user with one name:
  // the session folder is private, and a file planted in it anyway is refused (boundary/session_folder.py)
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat own {};
  if (fstat(fd, &own) != 0 || !S_ISREG(own.st_mode) || own.st_uid != geteuid() || own.st_nlink != 1) {
    close(fd);
    throw std::runtime_error("cannot use " + path + ": not a regular file of this user");
  }
  int err = reserve_table(fd);
  if (err != 0) {
    close(fd);
    throw std::runtime_error("cannot reserve space for " + path + ": " + std::strerror(err));
  }
  void* map = mmap(nullptr, sizeof(TableHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
  auto* j = new Joint();
  j->path = path;
  j->t = static_cast<TableHeader*>(map);
  g_joints->push_back(j);
  return static_cast<int>(g_joints->size() - 1);
}

Joint& joint_of(long handle) {
  if (g_joints == nullptr || handle < 0 || static_cast<size_t>(handle) >= g_joints->size()) {
    throw std::out_of_range("no such peak table");
  }
  return *(*g_joints)[static_cast<size_t>(handle)];
}

// Live bytes over time, bounded: each bucket of `width` nanoseconds keeps
// its highest, its lowest and its last point (each at its exact time), so a
// spike of microseconds rises and falls and the line between buckets holds
// the true value; when kMaxBuckets are kept, pairs are merged and the width
// doubles. The peak is never lost, as in model/timeline.py's downsampling.
struct TimelineBooks {
  using Point = std::pair<int64_t, uint64_t>;  // (epoch ns, live bytes)
  struct Bucket {
    Point high, low, last;
  };
  static constexpr size_t kMaxBuckets = 2048;
  std::vector<Bucket> buckets;
  int64_t width = 1000000;  // 1 ms
  int64_t bucket_start = 0;
  int64_t last_t = 0;  // times are made strictly increasing, so a bucket's points sort into their order
  Bucket current{};
  bool open = false;

  void clear() {
    buckets.clear();
    width = 1000000;
    last_t = 0;
    open = false;
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch()).count();
  }

  void note(uint64_t total) {
    int64_t t = std::max(now_ns(), last_t + 1);
    last_t = t;
    if (open && t < bucket_start + width) {
      if (total > current.high.second) current.high = {t, total};
      if (total < current.low.second) current.low = {t, total};
      current.last = {t, total};
      return;
    }
    if (open) keep(current);
    bucket_start = t;
    current = Bucket{{t, total}, {t, total}, {t, total}};
    open = true;
  }

  void keep(const Bucket& bucket) {
    buckets.push_back(bucket);
    if (buckets.size() < kMaxBuckets) return;
    size_t j = 0;
    for (size_t i = 0; i + 1 < buckets.size(); i += 2) {
      const Bucket& a = buckets[i];
      const Bucket& b = buckets[i + 1];
      buckets[j++] = Bucket{b.high.second > a.high.second ? b.high : a.high,
                            b.low.second < a.low.second ? b.low : a.low, b.last};
    }
    if (buckets.size() % 2) buckets[j++] = buckets.back();
    buckets.resize(j);
    width *= 2;
  }

  // a bucket's distinct points in time order
  static void emit(const Bucket& b, std::vector<Point>& out) {
    Point p[3] = {b.high, b.low, b.last};
    std::sort(p, p + 3);
    for (const Point& q : p) {
      if (out.empty() || out.back() != q) out.push_back(q);
    }
  }

  // the kept points, the open bucket's, and the (exact) present
  std::vector<Point> read(uint64_t now_total) const {
    std::vector<Point> out;
    out.reserve(3 * buckets.size() + 4);
    for (const Bucket& b : buckets) emit(b, out);
    if (open) emit(current, out);
    out.emplace_back(std::max(now_ns(), last_t + 1), now_total);
    return out;
  }
};

// The event history (model/history.py): every booked event (time, key,
// +bytes or -bytes), at most `limit` (set by the recorder from the model's
// MAX_EVENTS; 0 keeps none). When full, the oldest half is folded into
// `base`, the live bytes and count per key at the fold point, so any moment
// from `fold` on stays exact. Never throws: an event it cannot keep (out of
// memory) is counted in `dropped` and the history stops.
//
// An event's key is its site and its block's category tag, (site << kTagBits)
// | tag: a block's allocation and its free carry the same key, so the live set
// per key stays exact. A block tagged after its allocation was logged has that
// event rekeyed (retag): the category a block is given, whenever that is, is
// the category of its whole life in the history. No byte more per event.
struct HistoryBooks {
  static constexpr uint32_t kTagBits = 3;  // tags 0..7 (capture/books/categories.py: TAGGED, HISTORY_TAG_BITS)
  static constexpr uint64_t kNoEvent = UINT64_MAX;
  size_t limit = 0;
  std::vector<int64_t> times, sizes;
  std::vector<uint32_t> sites;  // keys: site and tag
  std::vector<std::pair<int64_t, int64_t>> base;  // by key
  int64_t fold = 0;
  uint64_t folded = 0, dropped = 0;

  static uint32_t key(uint32_t site, uint8_t tag) noexcept { return (site << kTagBits) | tag; }

  void clear() {
    times.clear();
    sizes.clear();
    sites.clear();
    base.clear();
    fold = 0;
    folded = dropped = 0;
  }

  // one event of *key*; its number (counted from the window's first event), kNoEvent when not kept
  uint64_t note(int64_t t, uint32_t key, int64_t size) noexcept {
    if (limit == 0 || dropped != 0) return kNoEvent;
    uint64_t number = folded + times.size();
    try {
      times.push_back(t);
      sites.push_back(key);
      sizes.push_back(size);
    } catch (...) {
      dropped = 1;
      times.resize(sizes.size());
      sites.resize(sizes.size());
      return kNoEvent;
    }
    if (times.size() >= limit) fold_oldest(times.size() / 2);
    return number;
  }

  // a live block of *site* and *nbytes*, allocated at event *number*, goes from tag *from* to *to*:
  // its allocation is rekeyed, in the log or, once folded, in the base (its free will carry *to*)
  void retag(uint64_t number, uint32_t site, uint8_t from, uint8_t to, uint64_t nbytes) noexcept {
    if (number == kNoEvent || dropped != 0 || number >= folded + times.size()) return;  // not this log's
    if (number >= folded) {
      sites[number - folded] = key(site, to);
      return;
    }
    uint32_t old_key = key(site, from), new_key = key(site, to);
    if (base.size() <= new_key) {
      try { base.resize(static_cast<size_t>(new_key) + 1); } catch (...) { dropped = 1; return; }
    }
    base[old_key].first -= static_cast<int64_t>(nbytes);
    base[old_key].second -= 1;
    base[new_key].first += static_cast<int64_t>(nbytes);
    base[new_key].second += 1;
  }

  void fold_oldest(size_t n) noexcept {
    uint32_t top = *std::max_element(sites.begin(), sites.begin() + n);
    if (base.size() <= top) {
      try { base.resize(top + 1); } catch (...) { dropped = 1; return; }
    }
    for (size_t i = 0; i < n; ++i) {
      base[sites[i]].first += sizes[i];
      base[sites[i]].second += sizes[i] > 0 ? 1 : -1;
    }
    fold = times[n - 1];
    folded += n;
    times.erase(times.begin(), times.begin() + n);
    sites.erase(sites.begin(), sites.begin() + n);
    sizes.erase(sizes.begin(), sizes.begin() + n);
  }
};

// Site 0: allocations made by threads that have no Python stack (PyTorch's
// own worker threads) or while the interpreter is shutting down.
constexpr uint32_t kNoPythonSite = 0;

// -- phases (gpuflame.phase, capture/books/phases.py) -------------------------------------
//
// A phase id comes from Python (0: before the first mark). A block's phase is
// part of its site: capture_site appends a marker frame (nullptr, -id) to the
// stack, so the same line in two phases books to two sites. Each phase keeps
// its own highest total the way the books keep the peak: the allocation
// number of that moment, and per site the blocks live then and freed since.
// Nothing is kept, and nothing costs, until the first mark.
std::atomic<uint32_t> g_phase{0};

struct PhasePeak {
  bool seen = false;
  uint64_t peak = 0, peak_seq = 0, end_inuse = 0;
  int64_t start_ns = 0, peak_ns = 0, end_ns = 0;
  std::unordered_map<uint32_t, std::pair<uint64_t, uint64_t>> gone;  // site -> live at the phase's peak, freed since
};

struct PhaseBooks {
  std::vector<PhasePeak> phases;  // by phase id; empty until the first mark
  uint32_t current = 0;

  void clear() {
    phases.clear();
    current = 0;
  }

  static void raise(PhasePeak& p, uint64_t total, uint64_t seq, int64_t t) {
    if (p.seen && total <= p.peak) return;
    p.seen = true;
    p.peak = total;
    p.peak_seq = seq;
    p.peak_ns = t;
    p.gone.clear();
  }

  void on_alloc(uint64_t total, uint64_t seq, int64_t t) {
    if (!phases.empty()) raise(phases[current], total, seq, t);
  }

  void on_free(uint64_t nbytes, uint64_t seq, uint32_t site) {
    for (auto& p : phases) {
      if (p.seen && seq != 0 && seq <= p.peak_seq) {
        auto& g = p.gone[site];
        g.first += nbytes;
        g.second += 1;
      }
    }
  }

  // the current phase ends now; *id* begins (its highest moment so far is at least now's total)
  void enter(uint32_t id, uint64_t total, uint64_t seq, int64_t now) {
    if (id >= phases.size()) phases.resize(id + 1);
    PhasePeak& old = phases[current];
    old.end_ns = now;
    old.end_inuse = total;
    PhasePeak& p = phases[id];
    if (!p.seen) p.start_ns = now;
    raise(p, total, seq, now);
    current = id;
  }
};

struct Books {
  std::mutex lock;
  std::unordered_map<StackKey, uint32_t, StackHash> site_of;
  std::vector<StackKey> stacks{StackKey{}};
  std::vector<SiteBooks> sites{SiteBooks{}};
  std::unordered_map<void*, Live> live;
  std::vector<uint32_t> gone_sites;  // sites whose gone_* is non-zero
  uint64_t seq = 0, total = 0, peak = 0, peak_seq = 0;
  uint64_t unhooked = 0;  // allocations handed out unwrapped (an unexpected data pointer)
  uint64_t lost = 0;      // allocations not booked: gpuflame itself ran out of memory
  bool recording = false;
  TimelineBooks timeline;
  HistoryBooks history;
  Joint* joint = nullptr;  // the run's table for this device, when in a run
  bool rows_joint = false;  // what the joint columns of the last rows() are: table, epoch, highest total
  uint64_t rows_generation = 0, rows_epoch = 0, rows_max = 0;
  uint64_t joint_seq = 0;  // the joint mark: blocks booked up to here were live then (if not gone since)
  std::vector<uint32_t> joint_sites;  // sites whose joint_gone_* is non-zero
  std::map<std::pair<uint32_t, uint8_t>, GoneTagged> gone_tagged;
  // tagged blocks live at the joint mark and freed since, per (site, tag): emptied at each mark
  std::map<std::pair<uint32_t, uint8_t>, GoneTagged> joint_gone_tagged;
  PhaseBooks phases;
  int64_t peak_ns = 0;  // when the peak was (phase 0 takes it at the first mark)

  void reset_window() {
    live.clear();
    gone_tagged.clear();
    joint_gone_tagged.clear();
    timeline.clear();
    phases.clear();
    peak_ns = 0;
    history.clear();
    for (auto& s : sites) s = SiteBooks{};
    gone_sites.clear();
    joint_sites.clear();
    seq = total = peak = peak_seq = unhooked = lost = joint_seq = 0;
  }

  // the books as they are now are this process's share at the table's current epoch
  void mark_joint() {
    joint_seq = seq;
    for (uint32_t s : joint_sites) sites[s].joint_gone_bytes = sites[s].joint_gone_count = 0;
    joint_sites.clear();
    if (!joint_gone_tagged.empty()) joint_gone_tagged.clear();
  }

  // lock the table and mark if the epoch moved; false when not publishing
  bool enter_joint() {
    if (joint == nullptr || joint->slot < 0 || !lock_table(*joint)) return false;
    if (table_moved(*joint)) mark_joint();
    return true;
  }

  void leave_joint(int64_t delta) {
    if (table_publish(*joint, delta)) mark_joint();
    unlock_table(*joint);
  }

  // a snapshot: the mark brought up to the table's epoch
  void look_joint() {
    if (enter_joint()) unlock_table(*joint);
  }

  // the map insert comes first: it is the only step that can throw (out of memory)
  void on_alloc(void* ptr, uint64_t n, uint32_t site) {
    Live& block = (live[ptr] = Live{n, seq + 1, site});
    bool shared = enter_joint();
    ++seq;
    SiteBooks& b = sites[site];
    b.alloc_bytes += n;
    b.alloc_count += 1;
    b.inuse_bytes += n;
    b.inuse_count += 1;
    total += n;
    timeline.note(total);
    block.event = history.note(timeline.last_t, HistoryBooks::key(site, 0), static_cast<int64_t>(n));
    if (total > peak) {
      peak = total;
      peak_seq = seq;
      peak_ns = timeline.last_t;
      for (uint32_t s : gone_sites) sites[s].gone_bytes = sites[s].gone_count = 0;
      gone_sites.clear();
    }
    phases.on_alloc(total, seq, timeline.last_t);
    if (shared) leave_joint(static_cast<int64_t>(n));
  }

  void note_gone_tagged(const Live& l);
  void set_phase(uint32_t id);

  // a block not in `live` was made before this window: nothing to book
  void on_free(void* ptr) {
    auto it = live.find(ptr);
    if (it == live.end()) return;
    Live l = it->second;
    live.erase(it);
    bool shared = enter_joint();
    SiteBooks& b = sites[l.site];
    b.inuse_bytes -= l.nbytes;
    b.inuse_count -= 1;
    total -= l.nbytes;
    timeline.note(total);
    history.note(timeline.last_t, HistoryBooks::key(l.site, l.tag), -static_cast<int64_t>(l.nbytes));
    if (l.seq <= peak_seq) {
      if (b.gone_count == 0) gone_sites.push_back(l.site);
      b.gone_bytes += l.nbytes;
      b.gone_count += 1;
      if (l.tag != 0) note_gone_tagged(l);
    }
    phases.on_free(l.nbytes, l.seq, l.site);
    if (l.seq <= joint_seq) {
      if (b.joint_gone_count == 0) joint_sites.push_back(l.site);
      b.joint_gone_bytes += l.nbytes;
      b.joint_gone_count += 1;
      if (l.tag != 0) {
        GoneTagged& g = joint_gone_tagged[{l.site, l.tag}];
        g.bytes += l.nbytes;
        g.count += 1;
      }
    }
    if (shared) leave_joint(-static_cast<int64_t>(l.nbytes));
  }
};

void Books::note_gone_tagged(const Live& l) {
  GoneTagged& g = gone_tagged[{l.site, l.tag}];
  if (g.peak_seq != peak_seq) g = GoneTagged{peak_seq, 0, 0};
  g.bytes += l.nbytes;
  g.count += 1;
}

// the first mark: the window so far was phase 0, whose highest moment is the peak so far
void Books::set_phase(uint32_t id) {
  if (phases.phases.empty()) {
    if (id == 0) return;
    phases.phases.resize(1);
    PhasePeak& p = phases.phases[0];
    p.seen = true;
    p.peak = peak;
    p.peak_seq = peak_seq;
    p.peak_ns = peak_ns;
    for (uint32_t s : gone_sites) p.gone[s] = {sites[s].gone_bytes, sites[s].gone_count};
  }
  phases.enter(id, total, seq, TimelineBooks::now_ns());
}

Books* books() {
  static Books* b = new Books();  // never destroyed: see the top of the file
  return b;
}

std::atomic<bool> g_enabled{false};
c10::DeleterFnPtr g_base_deleter = nullptr;
int g_max_depth = 256;
std::atomic<bool> g_native{false};
std::atomic<bool> g_own_frames{true};  // tests compare it with the public-API walk
std::atomic<int64_t> g_faults{0};  // tests: the next N bookings fail as if out of memory

// --native: which loaded object an address is in, cached per address (under the GIL)
enum class Image : uint8_t { kOther, kHook, kPython };
const void* g_hook_base = nullptr;
const void* g_python_base = nullptr;
std::unordered_map<uintptr_t, Image>* g_images = nullptr;

Image image_of(void* address) {
  auto key = reinterpret_cast<uintptr_t>(address);
  auto it = g_images->find(key);
  if (it != g_images->end()) return it->second;
  Dl_info info{};
  Image image = Image::kOther;
  if (dladdr(address, &info) != 0) {
    if (info.dli_fbase == g_hook_base) image = Image::kHook;
    else if (info.dli_fbase == g_python_base) image = Image::kPython;
  }
  g_images->emplace(key, image);
  return image;
}

// The native frames between the allocator and the interpreter, leaf first:
// gpuflame's own frames dropped, cut where the Python interpreter begins.
void add_native_frames(StackKey& stack, void* const* addresses, int n) {
  for (int i = 0; i < n; ++i) {
    Image image = image_of(addresses[i]);
    if (image == Image::kHook) continue;
    if (image == Image::kPython) break;
    stack.emplace_back(nullptr, static_cast<int64_t>(reinterpret_cast<uintptr_t>(addresses[i])));
  }
}

bool python_usable() {
  if (!Py_IsInitialized()) return false;
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return false;
#else
  if (_Py_IsFinalizing()) return false;
#endif
  return true;
}

// The site of the calling thread's Python stack; kNoPythonSite when it has
// none. Takes the GIL if the thread released it (PyTorch releases it around
// every operation), exactly as PyTorch's own CUDA memory history does.
struct GilGuard {
  PyGILState_STATE state = PyGILState_Ensure();
  ~GilGuard() { PyGILState_Release(state); }
};

// Walks the Python frames onto *stack*; frame references are released even
// if the vector cannot grow.
void add_python_frames(StackKey& stack) {
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());  // new reference
  try {
    int depth = 0;
    while (frame != nullptr && depth < g_max_depth) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
#if PY_VERSION_HEX >= 0x030B0000
      int64_t lasti = PyFrame_GetLasti(frame);
#else
      int64_t lasti = frame->f_lasti * 2;
#endif
      Py_DECREF(code);  // kept alive by the frame; an interned stack takes its own reference
      stack.emplace_back(reinterpret_cast<PyObject*>(code), lasti);
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
      ++depth;
    }
  } catch (...) {
    Py_XDECREF(frame);
    throw;
  }
  Py_XDECREF(frame);
}

// The site of *stack*, made on first sight. The books stay consistent if
// this throws: a site's books come first, its key last.
uint32_t intern(const StackKey& stack) {
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  auto it = b->site_of.find(stack);
  if (it != b->site_of.end()) return it->second;
  auto site = static_cast<uint32_t>(b->sites.size());
  b->sites.emplace_back();
  b->stacks.push_back(stack);
  for (const auto& f : stack) Py_XINCREF(f.first);
  b->site_of.emplace(stack, site);
  return site;
}

#ifdef GPUFLAME_OWN_FRAMES
// The Python frames of the calling thread, read without the GIL. Safe for
// the thread's own frames only: while it is in here (in C code, below the
// Python call that got it here), nothing can push, pop or change them, and
// each frame holds a strong reference to its code object. The walk skips
// incomplete frames exactly as PyFrame_GetBack does, and reports the same
// offset as PyFrame_GetLasti.
void walk_own_frames(PyThreadState* tstate, StackKey& stack) {
  _PyInterpreterFrame* f = tstate->cframe != nullptr ? tstate->cframe->current_frame : nullptr;
  int depth = 0;
  while (f != nullptr && depth < g_max_depth) {
    if (!_PyFrame_IsIncomplete(f)) {
      int64_t lasti = static_cast<int64_t>(_PyInterpreterFrame_LASTI(f)) * sizeof(_Py_CODEUNIT);
      stack.emplace_back(reinterpret_cast<PyObject*>(f->f_code), lasti);
      ++depth;
    }
    f = f->previous;
  }
}

// The site of a stack already seen, or kNoSite; no GIL needed: an interned
// stack holds references to its code objects, so a pointer match is the same code.
constexpr uint32_t kNoSite = UINT32_MAX;

uint32_t known_site(const StackKey& stack) {
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  auto it = b->site_of.find(stack);
  return it == b->site_of.end() ? kNoSite : it->second;
}
#endif

// the running phase as the stack's last frame: (nullptr, -id), never a native frame's address
void add_phase_marker(StackKey& stack) {
  uint32_t id = g_phase.load(std::memory_order_relaxed);
  if (id != 0) stack.emplace_back(nullptr, -static_cast<int64_t>(id));
}

// a thread without a Python stack (PyTorch's workers): the no-stack site of the running phase
uint32_t no_python_site() {
  uint32_t id = g_phase.load(std::memory_order_relaxed);
  if (id == 0) return kNoPythonSite;
  StackKey marker{FrameKey{nullptr, -static_cast<int64_t>(id)}};
  return intern(marker);  // no code objects in it: no GIL needed
}

// The site of the calling thread's stack; kNoPythonSite when it has no
// Python stack. On CPython 3.11 a stack seen before costs no GIL; otherwise
// the thread takes the GIL back for a moment if it released it (PyTorch
// releases it around every operation), as PyTorch's CUDA memory history does.
uint32_t capture_site() {
  if (!python_usable()) return kNoPythonSite;
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) return no_python_site();
  thread_local StackKey stack;
  stack.clear();
  bool native = g_native.load(std::memory_order_relaxed);
#ifdef GPUFLAME_OWN_FRAMES
  if (!native && g_own_frames.load(std::memory_order_relaxed)) {
    walk_own_frames(tstate, stack);
    if (stack.empty()) return no_python_site();
    add_phase_marker(stack);
    uint32_t site = known_site(stack);
    if (site != kNoSite) return site;
    GilGuard gil;  // first sight: the new stack takes references, which needs the GIL
    return intern(stack);
  }
#endif
  void* addresses[128];
  int n_native = native ? backtrace(addresses, 128) : 0;
  GilGuard gil;
  if (n_native > 0) add_native_frames(stack, addresses, n_native);
  add_python_frames(stack);
  if (!stack.empty()) add_phase_marker(stack);
  return stack.empty() ? no_python_site() : intern(stack);  // interned under the GIL: code objects are alive
}

void hooked_free(void* ptr) {
  Books* b = books();
  {
    std::lock_guard<std::mutex> guard(b->lock);
    if (b->recording) b->on_free(ptr);
    else b->live.erase(ptr);
  }
  g_base_deleter(ptr);
}

struct HookAllocator final : public c10::Allocator {
  c10::Allocator* base;
  explicit HookAllocator(c10::Allocator* b) : base(b) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr dp = base->allocate(n);
    void* ptr = dp.get();
    if (!g_enabled.load(std::memory_order_relaxed) || n == 0 || ptr == nullptr) return dp;
    if (dp.get_context() != ptr || dp.get_deleter() != g_base_deleter) {
      std::lock_guard<std::mutex> guard(books()->lock);
      books()->unhooked += 1;
      return dp;
    }
    Books* b = books();
    try {
      if (g_faults.load(std::memory_order_relaxed) > 0 && g_faults.fetch_sub(1) > 0) throw std::bad_alloc();
      uint32_t site = capture_site();
      std::lock_guard<std::mutex> guard(b->lock);
      if (b->recording) b->on_alloc(ptr, n, site);
      else b->live[ptr] = Live{n, 0, site};  // stopped meanwhile: only remember it is ours
    } catch (...) {  // never break the workload: the block is handed out unbooked
      std::lock_guard<std::mutex> guard(b->lock);
      b->lost += 1;
      return dp;
    }
    c10::Device device = dp.device();
    dp.release_context();
    return c10::DataPtr(ptr, ptr, &hooked_free, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &hooked_free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base->copy_data(dest, src, count);
  }
};

HookAllocator* g_hook = nullptr;  // never destroyed
c10::Allocator* g_installed = nullptr;  // the allocator the hook wraps: what stop() puts back

// torch.UntypedStorage(n) on the CPU (so storage.clone(), and copy.deepcopy of
// a tensor, a state dict or an optimizer's state) takes
// c10::GetDefaultCPUAllocator() itself, not the allocator SetCPUAllocator
// installed. Where the hook wraps that default allocator, the default's
// vtable pointer is pointed at DefaultShim's while recording, so its calls go
// through the hook too. PyTorch's DefaultCPUAllocator, like c10::Allocator and
// DefaultShim, holds nothing but that pointer: the hook's base is then a
// "twin", a copy of the original pointer, which still calls PyTorch's code.
struct DefaultShim final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override { return g_hook->allocate(n); }
  c10::DeleterFnPtr raw_deleter() const override { return g_hook->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_hook->copy_data(dest, src, count);
  }
};

c10::Allocator* g_default = nullptr;  // PyTorch's default CPU allocator, when the hook wraps it
void* g_twin[1] = {nullptr};  // the default's original vtable pointer, as an object of its own

void point_default(bool at_hook) {
  if (g_default == nullptr) return;
  static DefaultShim shim;
  void* vptr = at_hook ? *reinterpret_cast<void**>(&shim) : g_twin[0];
  __atomic_store_n(reinterpret_cast<void**>(g_default), vptr, __ATOMIC_RELEASE);
}

// The allocator the hook calls: the installed one, or the default's twin.
c10::Allocator* hook_base(c10::Allocator* current) {
  if (current != c10::GetDefaultCPUAllocator()) return current;
  g_default = current;
  g_twin[0] = *reinterpret_cast<void**>(current);
  return reinterpret_cast<c10::Allocator*>(g_twin);
}

void before_fork() { books()->lock.lock(); }
void after_fork() { books()->lock.unlock(); }

// -- Python interface ----------------------------------------------------------

bool prepare_native() {
  if (g_images != nullptr) return true;
  Dl_info hook{}, python{};
  if (dladdr(reinterpret_cast<void*>(&prepare_native), &hook) == 0 ||
      dladdr(reinterpret_cast<void*>(&PyEval_EvalCode), &python) == 0) {
    return false;
  }
  g_hook_base = hook.dli_fbase;
  g_python_base = python.dli_fbase;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first allocation
  g_images = new std::unordered_map<uintptr_t, Image>();
  return true;
}

// start(native=False, table=-1): table is a handle from table_open (the run's table for "cpu")
PyObject* py_start(PyObject*, PyObject* args) {
  int native = 0;
  long table = -1;
  if (!PyArg_ParseTuple(args, "|pl", &native, &table)) return nullptr;
  Joint* joint = table >= 0 ? &joint_of(table) : nullptr;
  if (native && !prepare_native()) {
    PyErr_SetString(PyExc_RuntimeError, "native frames: cannot locate the loaded images (dladdr failed)");
    return nullptr;
  }
  g_native.store(native != 0);
  c10::Allocator* current = c10::GetCPUAllocator();
  if (g_hook == nullptr) {
    if (current->raw_deleter() == nullptr) {
      PyErr_SetString(PyExc_RuntimeError,
                      "the installed CPU allocator does not support raw deletion; cannot wrap it");
      return nullptr;
    }
    g_installed = current;
    c10::Allocator* base = hook_base(current);
    g_base_deleter = base->raw_deleter();
    g_hook = new HookAllocator(base);
    pthread_atfork(before_fork, after_fork, after_fork);
  } else if (current != g_hook && current != g_installed) {
    PyErr_SetString(PyExc_RuntimeError, "another CPU allocator was installed since the hook was made");
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> guard(books()->lock);
    books()->reset_window();
    books()->joint = joint;
    if (joint != nullptr) table_rejoin(*joint);
    books()->recording = true;
  }
  g_enabled.store(true);
  c10::SetCPUAllocator(g_hook, /*priority=*/UINT8_MAX);
  point_default(true);
  Py_RETURN_NONE;
}

PyObject* py_stop(PyObject*, PyObject*) {
  g_enabled.store(false);
  point_default(false);
  if (g_hook != nullptr && c10::GetCPUAllocator() == g_hook) c10::SetCPUAllocator(g_installed, UINT8_MAX);
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  b->recording = false;
  if (b->enter_joint()) {  // this process's bytes stop counting in the run's table
    table_leave(*b->joint);
    unlock_table(*b->joint);
  }
  Py_RETURN_NONE;
}

PyObject* py_new_window(PyObject*, PyObject*) {
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  b->reset_window();
  if (b->joint != nullptr && b->recording) table_rejoin(*b->joint);  // a fork child: a slot of its own
  Py_RETURN_NONE;
}

// stacks(first): the stacks of sites first.., each a tuple of (code, offset), leaf first
PyObject* py_stacks(PyObject*, PyObject* arg) {
  Py_ssize_t first = PyLong_AsSsize_t(arg);
  if (first < 0 && PyErr_Occurred()) return nullptr;
  std::vector<StackKey> copy;
  {
    std::lock_guard<std::mutex> guard(books()->lock);
    auto& stacks = books()->stacks;
    if (static_cast<size_t>(first) < stacks.size()) copy.assign(stacks.begin() + first, stacks.end());
  }
  // the code objects are safe without the lock: interned stacks own a reference
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(copy.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < copy.size(); ++i) {
    PyObject* stack = PyTuple_New(static_cast<Py_ssize_t>(copy[i].size()));
    if (stack == nullptr) { Py_DECREF(out); return nullptr; }
    for (size_t j = 0; j < copy[i].size(); ++j) {
      PyObject* code = copy[i][j].first != nullptr ? copy[i][j].first : Py_None;
      PyObject* pair = Py_BuildValue("(OL)", code, static_cast<long long>(copy[i][j].second));
      if (pair == nullptr) { Py_DECREF(stack); Py_DECREF(out); return nullptr; }
      PyTuple_SET_ITEM(stack, static_cast<Py_ssize_t>(j), pair);
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), stack);
  }
  return out;
}

// rows(): [(site, peak bytes, peak count, inuse bytes, inuse count, alloc bytes, alloc count,
//          joint bytes, joint count)]: the site, then the per-site row whose columns
//          capture/books/site_row.py names (keep the two in step); totals() then says which
//          epoch of which table the joint columns are at
PyObject* py_rows(PyObject*, PyObject*) {
  std::vector<SiteBooks> sites;
  std::vector<std::pair<uint64_t, uint64_t>> peak, joint;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    if (b->recording) b->look_joint();
    sites = b->sites;
    peak.assign(sites.size(), {0, 0});
    joint.assign(sites.size(), {0, 0});
    bool marked = b->joint != nullptr && b->joint->seen != kNotSeen;
    for (const auto& [ptr, l] : b->live) {
      if (l.seq != 0 && l.seq <= b->peak_seq) {
        peak[l.site].first += l.nbytes;
        peak[l.site].second += 1;
      }
      if (marked && l.seq != 0 && l.seq <= b->joint_seq) {
        joint[l.site].first += l.nbytes;
        joint[l.site].second += 1;
      }
    }
    b->rows_joint = marked && !b->joint->broken;
    if (b->rows_joint) {
      b->rows_generation = b->joint->generation;
      b->rows_epoch = b->joint->seen;
      b->rows_max = b->joint->seen_max;
    }
  }
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < sites.size(); ++i) {
    const SiteBooks& s = sites[i];
    uint64_t pb = peak[i].first + s.gone_bytes, pc = peak[i].second + s.gone_count;
    uint64_t jb = joint[i].first + s.joint_gone_bytes, jc = joint[i].second + s.joint_gone_count;
    if (pb == 0 && pc == 0 && s.inuse_count == 0 && s.alloc_count == 0 && jc == 0) continue;
    PyObject* row = Py_BuildValue("(nKKKKKKKK)", static_cast<Py_ssize_t>(i), pb, pc, s.inuse_bytes, s.inuse_count,
                                  s.alloc_bytes, s.alloc_count, jb, jc);
    if (row == nullptr || PyList_Append(out, row) < 0) {
      Py_XDECREF(row);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(row);
  }
  return out;
}

// totals(): {"inuse": .., "peak": .., "allocations": .., "live": .., "unhooked": .., "sites": ..,
//           "joint_table": generation as hex ('' when the last rows() had no joint mark),
//           "joint_epoch": .., "joint_max": .., "joint_is_peak": 1 when the joint mark is the own peak's}
PyObject* py_totals(PyObject*, PyObject*) {
  uint64_t total, peak, seq, live, unhooked, lost, nsites, epoch = 0, max = 0, same = 0;
  char table[17] = "";
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    total = b->total; peak = b->peak; seq = b->seq; live = b->live.size();
    unhooked = b->unhooked; lost = b->lost; nsites = b->sites.size();
    if (b->rows_joint) {
      std::snprintf(table, sizeof table, "%016llx", static_cast<unsigned long long>(b->rows_generation));
      epoch = b->rows_epoch;
      max = b->rows_max;
      same = b->joint_seq == b->peak_seq;  // one moment: the blocks live at both marks are the same
    }
  }
  return Py_BuildValue("{sKsKsKsKsKsKsKsssKsKsK}", "inuse", total, "peak", peak, "allocations", seq, "live", live,
                       "unhooked", unhooked, "lost", lost, "sites", nsites, "joint_table", table,
                       "joint_epoch", epoch, "joint_max", max, "joint_is_peak", same);
}

// -- the run's tables, for the dispatch recorder -------------------------------------

// table_open(path) -> handle (the same handle for the same path in this process)
PyObject* py_table_open(PyObject*, PyObject* arg) {
  const char* path = PyUnicode_AsUTF8(arg);
  if (path == nullptr) return nullptr;
  return PyLong_FromLong(open_table(path));
}

// table_join(handle) -> whether this process now publishes to it (a new window, a fork child)
PyObject* py_table_join(PyObject*, PyObject* arg) {
  long handle = PyLong_AsLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(table_rejoin(joint_of(handle)));
}

// table_leave(handle, key, append): stop publishing; a mark first if the epoch moved
PyObject* py_table_leave(PyObject*, PyObject* args) {
  long handle;
  PyObject *key, *append;
  if (!PyArg_ParseTuple(args, "lOO", &handle, &key, &append)) return nullptr;
  Joint& j = joint_of(handle);
  if (j.slot < 0 || !lock_table(j)) Py_RETURN_NONE;
  bool moved = table_moved(j);
  table_leave(j);
  uint64_t epoch = j.seen, max = j.seen_max;
  unlock_table(j);
  if (moved) return PyObject_CallFunction(append, "((OKK))", key, epoch, max);
  Py_RETURN_NONE;
}

// table_event(handle, delta, append, item, key): publish one event of this
// process and queue it with append(item), preceded by append((key, epoch,
// highest total)) when the epoch moved since this process last looked and
// followed by one when this event raised the highest total. One C call
// under the GIL: no other thread of the process comes between.
// delta 0: only look (a snapshot). Not publishing: only append(item).
PyObject* py_table_event(PyObject*, PyObject* args) {
  long handle;
  long long delta;
  PyObject *append, *item, *key;
  if (!PyArg_ParseTuple(args, "lLOOO", &handle, &delta, &append, &item, &key)) return nullptr;
  Joint& j = joint_of(handle);
  bool before = false, after = false;
  uint64_t e0 = 0, m0 = 0, e1 = 0, m1 = 0;
  if (j.slot >= 0 && lock_table(j)) {
    before = table_moved(j);
    e0 = j.seen, m0 = j.seen_max;
    if (delta != 0) after = table_publish(j, delta);
    e1 = j.seen, m1 = j.seen_max;
    unlock_table(j);
  }
  PyObject* r;
  if (before) {
    if ((r = PyObject_CallFunction(append, "((OKK))", key, e0, m0)) == nullptr) return nullptr;
    Py_DECREF(r);
  }
  if (item != Py_None) {
    if ((r = PyObject_CallOneArg(append, item)) == nullptr) return nullptr;
    Py_DECREF(r);
  }
  if (after) {
    if ((r = PyObject_CallFunction(append, "((OKK))", key, e1, m1)) == nullptr) return nullptr;
    Py_DECREF(r);
  }
  Py_RETURN_NONE;
}

// table_info(handle) -> (generation as hex, or '' when not usable)
PyObject* py_table_info(PyObject*, PyObject* arg) {
  long handle = PyLong_AsLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  Joint& j = joint_of(handle);
  char table[17] = "";
  if (!j.broken && j.generation != 0) {
    std::snprintf(table, sizeof table, "%016llx", static_cast<unsigned long long>(j.generation));
  }
  return PyUnicode_FromString(table);
}

// timeline(): [(epoch ns, live bytes)], the last point being now
PyObject* py_timeline(PyObject*, PyObject*) {
  std::vector<std::pair<int64_t, uint64_t>> points;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    if (b->seq == 0) return PyList_New(0);
    points = b->timeline.read(b->total);
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(points.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < points.size(); ++i) {
    PyObject* point = Py_BuildValue("(LK)", static_cast<long long>(points[i].first), points[i].second);
    if (point == nullptr) { Py_DECREF(out); return nullptr; }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), point);
  }
  return out;
}

// history_limit(n): keep at most n events (model/history.py's MAX_EVENTS); 0 keeps none
PyObject* py_history_limit(PyObject*, PyObject* arg) {
  unsigned long long n = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  b->history.limit = static_cast<size_t>(n);
  Py_RETURN_NONE;
}

// a column as bytes, its vector freed: copied a MiB at a time, each copied page of the vector handed
// back to the kernel at once (MADV_DONTNEED: it reads as zeros after), so a full history's 8 MB column
// never sits in memory twice (issue 23: no RSS jump at stop)
template <typename T>
PyObject* column_bytes(std::vector<T>& column) {
  size_t size = column.size() * sizeof(T);
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
  if (out == nullptr) return nullptr;
  char* from = reinterpret_cast<char*>(column.data());
  char* to = PyBytes_AS_STRING(out);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t released = (reinterpret_cast<uintptr_t>(from) + page - 1) & ~(page - 1);  // whole pages only
  constexpr size_t kPiece = size_t{1} << 20;
  for (size_t done = 0; done < size;) {
    size_t n = std::min(kPiece, size - done);
    std::memcpy(to + done, from + done, n);
    done += n;
    uintptr_t copied = (reinterpret_cast<uintptr_t>(from) + done) & ~(page - 1);
    if (copied > released) {
      madvise(reinterpret_cast<void*>(released), copied - released, MADV_DONTNEED);
      released = copied;
    }
  }
  std::vector<T>().swap(column);
  return out;
}

// the keys (site and tag) the history names (its events' and the base's), in order; events renumbered to
// their rank
PyObject* dense_sites(HistoryBooks& h, std::vector<uint32_t>& rank) {
  for (uint32_t s : h.sites) {
    if (s >= rank.size()) rank.resize(static_cast<size_t>(s) + 1, 0);
    rank[s] = 1;
  }
  if (h.base.size() > rank.size()) rank.resize(h.base.size(), 0);
  for (size_t s = 0; s < h.base.size(); ++s) {
    if (h.base[s].first != 0 || h.base[s].second != 0) rank[s] = 1;
  }
  PyObject* used = PyList_New(0);
  if (used == nullptr) return nullptr;
  uint32_t n = 0;
  for (size_t s = 0; s < rank.size(); ++s) {
    if (!rank[s]) continue;
    PyObject* id = PyLong_FromSize_t(s);
    if (id == nullptr || PyList_Append(used, id) < 0) { Py_XDECREF(id); Py_DECREF(used); return nullptr; }
    Py_DECREF(id);
    rank[s] = n++;
  }
  for (uint32_t& s : h.sites) s = rank[s];
  return used;
}

// history(take=False): (fold ns, folded, dropped, [(site, bytes, count)] at the fold, times, sites, sizes,
// used) with times and sizes as native int64 bytes and sites as native uint32 bytes; sites are numbered
// by their rank among `used`, the keys the history names, in order, each the hook's site id << 3 | its
// blocks' category tag (HistoryBooks; model/history.py's of_track renumbers the same way). take=True (a
// stopped recording) hands the books' history over instead of copying it: the hook's history is empty
// afterwards.
PyObject* py_history(PyObject*, PyObject* args) {
  int take = 0;
  if (!PyArg_ParseTuple(args, "|p", &take)) return nullptr;
  HistoryBooks h;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    if (take) {
      h.times.swap(b->history.times);
      h.sites.swap(b->history.sites);
      h.sizes.swap(b->history.sizes);
      h.base.swap(b->history.base);
    } else {
      h.times = b->history.times;
      h.sites = b->history.sites;
      h.sizes = b->history.sizes;
      h.base = b->history.base;
    }
    h.fold = b->history.fold;
    h.folded = b->history.folded;
    h.dropped = b->history.dropped;
    if (take) {
      size_t limit = b->history.limit;
      b->history.clear();
      b->history.limit = limit;
    }
  }
  std::vector<uint32_t> rank;  // the hook's site id -> its rank among those used
  PyObject* used = dense_sites(h, rank);
  if (used == nullptr) return nullptr;
  PyObject* base = PyList_New(0);
  if (base == nullptr) { Py_DECREF(used); return nullptr; }
  for (size_t s = 0; s < h.base.size(); ++s) {
    if (h.base[s].first == 0 && h.base[s].second == 0) continue;
    PyObject* row = Py_BuildValue("(kLL)", static_cast<unsigned long>(rank[s]), static_cast<long long>(h.base[s].first),
                                  static_cast<long long>(h.base[s].second));
    if (row == nullptr || PyList_Append(base, row) < 0) {
      Py_XDECREF(row);
      Py_DECREF(base);
      Py_DECREF(used);
      return nullptr;
    }
    Py_DECREF(row);
  }
  PyObject* times = column_bytes(h.times);
  PyObject* sites = times == nullptr ? nullptr : column_bytes(h.sites);
  PyObject* sizes = sites == nullptr ? nullptr : column_bytes(h.sizes);
  if (sizes == nullptr) {
    Py_XDECREF(times);
    Py_XDECREF(sites);
    Py_DECREF(base);
    Py_DECREF(used);
    return nullptr;
  }
  return Py_BuildValue("(LKKNNNNN)", static_cast<long long>(h.fold), static_cast<unsigned long long>(h.folded),
                       static_cast<unsigned long long>(h.dropped), base, times, sites, sizes, used);
}

// decimal digits of v, sign included, written backwards from the end of buf; returns where they start
// (|v| < 2**64 always: the difference of two int64; 64-bit division, not 128-bit, which is a library call)
char* decimal(__int128 v, char* end) {
  bool negative = v < 0;
  uint64_t u = static_cast<uint64_t>(negative ? -v : v);
  do {
    *--end = static_cast<char>('0' + static_cast<int>(u % 10));
    u /= 10;
  } while (u != 0);
  if (negative) *--end = '-';
  return end;
}

// ints_text(column, previous=None) -> bytes: the integers of an int64 or uint32 buffer as JSON text
// without brackets ("1,-2,3"); with previous, each value minus the one before it (the first minus
// previous). model/history.py writes the event history's columns with it: a C loop where Python
// makes an int and a str per value (the writer's pure-Python way gives the same text).
PyObject* py_ints_text(PyObject*, PyObject* args) {
  PyObject* column = nullptr;
  PyObject* previous = Py_None;
  if (!PyArg_ParseTuple(args, "O|O", &column, &previous)) return nullptr;
  bool delta = previous != Py_None;
  long long prev = 0;
  if (delta) {
    prev = PyLong_AsLongLong(previous);
    if (prev == -1 && PyErr_Occurred()) return nullptr;
  }
  Py_buffer view;
  if (PyObject_GetBuffer(column, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return nullptr;
  const char* format = view.format != nullptr ? view.format : "B";
  if (*format == '@' || *format == '=') ++format;
  bool wide = view.itemsize == 8 && (std::strcmp(format, "q") == 0 || std::strcmp(format, "l") == 0);
  bool narrow = view.itemsize == 4 && (std::strcmp(format, "I") == 0 || std::strcmp(format, "L") == 0);
  if (!wide && !narrow) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_TypeError, "ints_text() takes a buffer of int64 ('q') or uint32 ('I')");
    return nullptr;
  }
  Py_ssize_t n = view.len / view.itemsize;
  std::string text;
  text.reserve(static_cast<size_t>(n) * 8);
  char digits[48];
  char* end = digits + sizeof digits;
  __int128 before = prev;
  for (Py_ssize_t i = 0; i < n; ++i) {
    __int128 v = wide ? static_cast<__int128>(static_cast<const int64_t*>(view.buf)[i])
                      : static_cast<__int128>(static_cast<const uint32_t*>(view.buf)[i]);
    if (i) text.push_back(',');
    const char* first = decimal(delta ? v - before : v, end);
    text.append(first, static_cast<size_t>(end - first));
    before = v;
  }
  PyBuffer_Release(&view);
  return PyBytes_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

// tag([(address, tag)]): give live blocks their category (capture/books/categories.py); unknown ones are skipped
PyObject* py_tag(PyObject*, PyObject* arg) {
  std::vector<std::pair<void*, uint8_t>> tags;
  PyObject* seq = PySequence_Fast(arg, "tag() takes a list of (address, tag)");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  tags.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    unsigned long long address = 0;
    unsigned int tag = 0;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KI", &address, &tag)) { Py_DECREF(seq); return nullptr; }
    if (tag >= (1u << HistoryBooks::kTagBits)) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "tag() takes tags below 8");
      return nullptr;
    }
    tags.emplace_back(reinterpret_cast<void*>(address), static_cast<uint8_t>(tag));
  }
  Py_DECREF(seq);
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  for (const auto& [ptr, tag] : tags) {
    auto it = b->live.find(ptr);
    if (it == b->live.end() || it->second.tag == tag) continue;
    Live& l = it->second;
    b->history.retag(l.event, l.site, l.tag, tag, l.nbytes);  // the history's events carry the block's category
    l.tag = tag;
  }
  Py_RETURN_NONE;
}

// blocks(): [(address, bytes, site, live at the peak, tag, live at the joint mark)] of the window's live blocks
PyObject* py_blocks(PyObject*, PyObject*) {
  std::vector<std::tuple<uintptr_t, uint64_t, uint32_t, bool, uint8_t, bool>> rows;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    bool marked = b->joint != nullptr && b->joint->seen != kNotSeen;
    rows.reserve(b->live.size());
    for (const auto& [ptr, l] : b->live) {
      if (l.seq != 0) {
        rows.emplace_back(reinterpret_cast<uintptr_t>(ptr), l.nbytes, l.site, l.seq <= b->peak_seq, l.tag,
                          marked && l.seq <= b->joint_seq);
      }
    }
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [ptr, nbytes, site, at_peak, tag, at_joint] = rows[i];
    PyObject* row = Py_BuildValue("(KKIOIO)", static_cast<unsigned long long>(ptr), nbytes, site,
                                  at_peak ? Py_True : Py_False, static_cast<unsigned int>(tag),
                                  at_joint ? Py_True : Py_False);
    if (row == nullptr) { Py_DECREF(out); return nullptr; }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), row);
  }
  return out;
}

// gone_tagged(joint=False): [(site, tag, bytes, count)] of tagged blocks live at the peak (with joint: at
// the run's joint mark) and freed since
PyObject* py_gone_tagged(PyObject*, PyObject* args) {
  int joint = 0;
  if (!PyArg_ParseTuple(args, "|p", &joint)) return nullptr;
  std::vector<std::tuple<uint32_t, uint8_t, uint64_t, uint64_t>> rows;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    if (joint) {
      for (const auto& [key, g] : b->joint_gone_tagged) {
        if (g.count != 0) rows.emplace_back(key.first, key.second, g.bytes, g.count);
      }
    } else {
      for (const auto& [key, g] : b->gone_tagged) {
        if (g.peak_seq == b->peak_seq && g.count != 0) rows.emplace_back(key.first, key.second, g.bytes, g.count);
      }
    }
  }
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const auto& [site, tag, nbytes, count] : rows) {
    PyObject* row = Py_BuildValue("(IIKK)", site, static_cast<unsigned int>(tag), nbytes, count);
    if (row == nullptr || PyList_Append(out, row) < 0) { Py_XDECREF(row); Py_DECREF(out); return nullptr; }
    Py_DECREF(row);
  }
  return out;
}

// set_phase(id): the running phase from now on (capture/books/phases.py; 0: none)
PyObject* py_set_phase(PyObject*, PyObject* arg) {
  long id = PyLong_AsLong(arg);
  if (id == -1 && PyErr_Occurred()) return nullptr;
  if (id < 0 || id > 65535) {
    PyErr_SetString(PyExc_ValueError, "phase id out of range");
    return nullptr;
  }
  Books* b = books();
  std::lock_guard<std::mutex> guard(b->lock);
  if (b->recording) b->set_phase(static_cast<uint32_t>(id));
  g_phase.store(static_cast<uint32_t>(id));
  Py_RETURN_NONE;
}

// phase_rows(): [(id, start ns, end ns (0: still running), peak, peak ns, in use at end,
//                 [(site, bytes) live at the phase's peak])] of each phase seen; [] before the first mark
PyObject* py_phase_rows(PyObject*, PyObject*) {
  struct Row {
    uint32_t id;
    PhasePeak p;
    std::unordered_map<uint32_t, uint64_t> at_peak;
  };
  std::vector<Row> rows;
  {
    Books* b = books();
    std::lock_guard<std::mutex> guard(b->lock);
    const auto& phases = b->phases.phases;
    for (uint32_t id = 0; id < phases.size(); ++id) {
      if (!phases[id].seen) continue;
      Row r{id, phases[id], {}};
      r.p.gone.clear();
      for (const auto& [site, g] : phases[id].gone) r.at_peak[site] += g.first;
      for (const auto& [ptr, l] : b->live) {
        if (l.seq != 0 && l.seq <= phases[id].peak_seq) r.at_peak[l.site] += l.nbytes;
      }
      if (id == b->phases.current) {
        r.p.end_ns = 0;
        r.p.end_inuse = b->total;
      }
      rows.push_back(std::move(r));
    }
  }
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (const Row& r : rows) {
    PyObject* sites = PyList_New(0);
    if (sites == nullptr) { Py_DECREF(out); return nullptr; }
    for (const auto& [site, nbytes] : r.at_peak) {
      PyObject* pair = Py_BuildValue("(IK)", site, nbytes);
      if (pair == nullptr || PyList_Append(sites, pair) < 0) { Py_XDECREF(pair); Py_DECREF(sites); Py_DECREF(out); return nullptr; }
      Py_DECREF(pair);
    }
    PyObject* row = Py_BuildValue("(ILLKLKN)", r.id, static_cast<long long>(r.p.start_ns),
                                  static_cast<long long>(r.p.end_ns), r.p.peak, static_cast<long long>(r.p.peak_ns),
                                  r.p.end_inuse, sites);
    if (row == nullptr || PyList_Append(out, row) < 0) { Py_XDECREF(row); Py_DECREF(out); return nullptr; }
    Py_DECREF(row);
  }
  return out;
}

PyObject* py_symbol(PyObject*, PyObject* arg) {
  unsigned long long address = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  Dl_info info{};
  std::string name, file;
  // a return address points after the call: look up the byte before it
  if (dladdr(reinterpret_cast<void*>(address - 1), &info) != 0) {
    if (info.dli_fname != nullptr) file = info.dli_fname;
    if (info.dli_sname != nullptr) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      name = (status == 0 && demangled != nullptr) ? demangled : info.dli_sname;
      std::free(demangled);
    }
  }
  return Py_BuildValue("(ss)", name.c_str(), file.c_str());
}

PyObject* py_installed(PyObject*, PyObject*) {
  return PyBool_FromLong(g_hook != nullptr && c10::GetCPUAllocator() == g_hook);
}

// inject_faults(n): the next n bookings fail as if gpuflame were out of memory (tests)
PyObject* py_inject_faults(PyObject*, PyObject* arg) {
  long long n = PyLong_AsLongLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  g_faults.store(n);
  Py_RETURN_NONE;
}

// own_frames(on) -> previous: read the thread's frames without the GIL where
// this CPython allows it (tests compare both walks); False where it cannot
PyObject* py_own_frames(PyObject*, PyObject* arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
#ifdef GPUFLAME_OWN_FRAMES
  return PyBool_FromLong(g_own_frames.exchange(on != 0));
#else
  Py_RETURN_FALSE;
#endif
}

// C++ exceptions must not cross into the interpreter: they become Python errors
template <PyObject* (*F)(PyObject*, PyObject*)>
PyObject* guarded(PyObject* self, PyObject* arg) {
  try {
    return F(self, arg);
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "gpuflame's CPU allocator hook failed");
  }
  return nullptr;
}

PyMethodDef kMethods[] = {
    {"start", guarded<py_start>, METH_VARARGS, "start(native=False): wrap the CPU allocator, open a new window."},
    {"own_frames", guarded<py_own_frames>, METH_O, "Read frames without the GIL (CPython 3.11); returns the old value."},
    {"inject_faults", guarded<py_inject_faults>, METH_O, "Tests: fail the next n bookings."},
    {"symbol", guarded<py_symbol>, METH_O, "symbol(address) -> (demangled name or '', object file or '')."},
    {"stop", guarded<py_stop>, METH_NOARGS, "Put the wrapped allocator back; the books stay readable."},
    {"new_window", guarded<py_new_window>, METH_NOARGS, "Forget what was recorded (a forked child's window starts)."},
    {"stacks", guarded<py_stacks>, METH_O, "Stacks of the sites from the given index on."},
    {"rows", guarded<py_rows>, METH_NOARGS, "Peak, in-use and allocated bytes and counts per site."},
    {"totals", guarded<py_totals>, METH_NOARGS, "Totals of the current window."},
    {"timeline", guarded<py_timeline>, METH_NOARGS, "Live bytes over time (bounded, peaks kept)."},
    {"history_limit", guarded<py_history_limit>, METH_O, "Keep at most n events of history (0: none)."},
    {"history", guarded<py_history>, METH_VARARGS, "history(take=False): fold, folded, dropped, base, events, sites."},
    {"ints_text", guarded<py_ints_text>, METH_VARARGS, "ints_text(int64 or uint32 buffer, previous=None) -> b'1,2'."},
    {"tag", guarded<py_tag>, METH_O, "tag([(address, tag)]): categories of live blocks (categories.py)."},
    {"blocks", guarded<py_blocks>, METH_NOARGS, "Live blocks: (address, bytes, site, at peak, tag, at joint)."},
    {"gone_tagged", guarded<py_gone_tagged>, METH_VARARGS, "Tagged blocks live at the peak (or joint mark), freed since."},
    {"set_phase", guarded<py_set_phase>, METH_O, "set_phase(id): the running phase from now on (0: none)."},
    {"phase_rows", guarded<py_phase_rows>, METH_NOARGS, "Each phase's peak, its time, in use at its end, sites at it."},
    {"installed", guarded<py_installed>, METH_NOARGS, "Whether the hook is the CPU allocator now."},
    {"table_open", guarded<py_table_open>, METH_O, "Map a run's shared peak table; its handle."},
    {"table_join", guarded<py_table_join>, METH_O, "Publish to a table (again): a new window, a fork child."},
    {"table_leave", guarded<py_table_leave>, METH_VARARGS, "Stop publishing to a table (key, append for a last mark)."},
    {"table_event", guarded<py_table_event>, METH_VARARGS, "Publish one event and queue it with its marks."},
    {"table_info", guarded<py_table_info>, METH_O, "The table's generation (hex), '' when not usable."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "gpuflame_cpu_hook", "gpuflame's CPU allocator hook.", -1, kMethods,
                     nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_gpuflame_cpu_hook(void) { return PyModule_Create(&kModule); }
