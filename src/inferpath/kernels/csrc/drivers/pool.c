/* A thread pool for the decode step (decode.c), in place of OpenMP's there.
 *
 * A decode step of a small model is ~120 short parallel sections (tens of microseconds
 * each). Under OMP_WAIT_POLICY=PASSIVE every section wakes its threads through the kernel
 * (as long as the work itself); spinning OpenMP threads instead hold a core that another
 * program needs, and wait on a thread that is not running. Here a worker spins for
 * SPIN_NS after its last chunk (the next section of the step comes within microseconds)
 * and then sleeps until woken; and work is claimed a chunk at a time from a shared counter,
 * so when a worker is not running the caller does its share instead of waiting for it.
 *
 * One job at a time: the caller publishes (generation, front, back) in one 64-bit word and
 * claims chunks from the front while the workers claim them from the back, each by
 * compare-and-swap on that word (a claim for an older generation fails): each thread
 * reads the weights in one direction through a contiguous range (a chunk claimed in turn
 * by alternate threads halved the streaming rate), and the two meet wherever the work
 * divides. The caller returns once every chunk is done. A second caller while a job runs
 * (another Python thread: ctypes releases the GIL) runs its chunks itself; a forked child
 * starts with no workers.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define relax() _mm_pause()
#else
#define relax() ((void)0)
#endif

#include "pool.h"

#define MAX_WORKERS 63
#define SPIN_NS 100000  /* 100 us */

static struct {
    _Atomic uint64_t word;      /* generation << 48 | front << 24 | back: chunks [front, back) are left */
    _Atomic int64_t done;       /* chunks finished of the current job */
    pool_task fn;               /* the current job (valid while it has chunks left) */
    void *ctx;
    int workers;
    int sleepers;               /* under lock */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_mutex_t busy;       /* held by the caller of the running job */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .busy = PTHREAD_MUTEX_INITIALIZER};

#define GEN(word) ((uint32_t)((word) >> 48))
#define FRONT(word) ((int64_t)(((word) >> 24) & 0xffffff))
#define BACK(word) ((int64_t)((word) & 0xffffff))
#define MAX_CHUNKS 0xffffff

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Claims and runs chunks of generation gen, from the front or the back, until none is
 * left; returns how many it ran. */
static int64_t work(uint32_t gen, int from_front) {
    int64_t ran = 0;
    for (;;) {
        uint64_t word = atomic_load_explicit(&pool.word, memory_order_acquire);
        if (GEN(word) != gen) return ran;
        int64_t front = FRONT(word), back = BACK(word);
        if (front >= back) return ran;
        uint64_t claimed = from_front ? word + ((uint64_t)1 << 24) : word - 1;
        if (!atomic_compare_exchange_weak_explicit(&pool.word, &word, claimed, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;  /* another claim, or a new job: look again */
        /* the claim succeeded on the current job's word: its fields are that job's, and it
         * cannot end before this chunk is counted done */
        pool.fn(pool.ctx, from_front ? front : back - 1);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        ran++;
    }
}

static void *worker(void *arg) {
    (void)arg;
    uint32_t seen = GEN(atomic_load(&pool.word));
    for (;;) {
        int64_t start = now_ns();
        uint32_t gen;
        for (int spins = 0;; spins++) {  /* spin a while for the next job ... */
            gen = GEN(atomic_load_explicit(&pool.word, memory_order_acquire));
            if (gen != seen) break;
            relax();
            if ((spins & 255) == 255 && now_ns() - start > SPIN_NS) {  /* ... then sleep */
                pthread_mutex_lock(&pool.lock);
                pool.sleepers++;
                while ((gen = GEN(atomic_load(&pool.word))) == seen)
                    pthread_cond_wait(&pool.wake, &pool.lock);
                pool.sleepers--;
                pthread_mutex_unlock(&pool.lock);
                break;
            }
        }
        seen = gen;
        work(gen, 0);
    }
    return 0;
}

static void forked_child(void);
static void register_fork_handler(void) { pthread_atfork(0, 0, forked_child); }

/* In a forked child the workers are gone (and a lock may have been held): start afresh. */
static void forked_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    pool.lock = fresh, pool.busy = fresh, pool.wake = fresh_cond;
    pool.workers = 0, pool.sleepers = 0;
}

void pool_run(int threads, pool_task fn, void *ctx, int64_t chunks) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (chunks < 1) return;
    int wanted = threads - 1 < MAX_WORKERS ? threads - 1 : MAX_WORKERS;
    if (wanted < 1 || chunks == 1 || chunks > MAX_CHUNKS || pthread_mutex_trylock(&pool.busy) != 0) {
        for (int64_t c = 0; c < chunks; c++) fn(ctx, c);
        return;
    }
    pthread_once(&once, register_fork_handler);
    while (pool.workers < wanted) {  /* started once, kept */
        pthread_t thread;
        if (pthread_create(&thread, 0, worker, 0) != 0) break;
        pthread_detach(thread);
        pool.workers++;
    }
    uint32_t gen = (GEN(atomic_load(&pool.word)) + 1) & 0xffff;
    pool.fn = fn, pool.ctx = ctx;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.word, (uint64_t)gen << 48 | (uint64_t)chunks, memory_order_release);
    pthread_mutex_lock(&pool.lock);
    if (pool.sleepers) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    work(gen, 1);
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < chunks; spins++) {
        relax();
        if ((spins & 1023) == 1023) sched_yield();  /* a worker mid-chunk lost its core */
    }
    pthread_mutex_unlock(&pool.busy);
}
