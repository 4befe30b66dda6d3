/*
 * Our own C declarations of HAMi-core's shared region (v0 and v1), written from LAYOUT.md,
 * compiled with gcc by tests/monitor/test_layout_c.py.  Two modes:
 *
 *   region offsets
 *       prints "<format> <table> <member> <offset> <size>" for every member, plus a
 *       "sizeof" row per struct; the test compares them with hami_trio.monitor.layout.
 *
 *   region write <v0|v1> <path> <num> <proc_num> <nslots>
 *       writes a fixture file (sizeof + 1 bytes, like HAMi-core) filled with the pattern
 *       below, then prints the sums a monitor must report, computed here in uint64:
 *         "active <n>"  and one "sum <dev> <total> <ctx> <module> <data> <offset> <sm>" per
 *         device below min(num, 16), over slots [0, clamp(proc_num, 0, 1024)) with status != 0.
 *       The Python test builds the same pattern with hami_trio.testing.regions and checks the
 *       two files are byte-identical and that the Python snapshot has these sums.
 */
#include <semaphore.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 16
#define MAX_SLOTS 1024

typedef struct {
    uint64_t context_size, module_size, data_size, offset, total;
} mem_v0;
typedef struct {
    uint64_t context_size, module_size, data_size, offset, total, unused[3];
} mem_v1;
typedef struct {
    uint64_t dec_util, enc_util, sm_util;
} util_v0;
typedef struct {
    uint64_t dec_util, enc_util, sm_util, unused[3];
} util_v1;

typedef struct {
    int32_t pid;
    int32_t hostpid;
    mem_v0 used[MAX_DEVICES];
    uint64_t monitorused[MAX_DEVICES];
    util_v0 device_util[MAX_DEVICES];
    int32_t status;
} slot_v0;

typedef struct {
    int32_t pid;
    int32_t hostpid;
    mem_v1 used[MAX_DEVICES];
    uint64_t monitorused[MAX_DEVICES];
    util_v1 device_util[MAX_DEVICES];
    int32_t status;
    uint64_t seqlock;
    uint64_t unused[2];
} slot_v1;

typedef struct {
    _Atomic int32_t initialized_flag;
    _Atomic int32_t sm_init_flag;
    _Atomic size_t owner_pid;
    sem_t sem;
    uint64_t num;
    char uuids[MAX_DEVICES][96];
    uint64_t limit[MAX_DEVICES];
    uint64_t sm_limit[MAX_DEVICES];
    slot_v0 procs[MAX_SLOTS];
    _Atomic int32_t proc_num;
    _Atomic int32_t utilization_switch;
    _Atomic int32_t recent_kernel;
    int32_t priority;
} region_v0;

typedef struct {
    _Atomic int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    _Atomic int32_t sm_init_flag;
    _Atomic size_t owner_pid;
    sem_t sem;
    uint64_t num;
    char uuids[MAX_DEVICES][96];
    uint64_t limit[MAX_DEVICES];
    uint64_t sm_limit[MAX_DEVICES];
    slot_v1 procs[MAX_SLOTS];
    _Atomic int32_t proc_num;
    _Atomic int32_t utilization_switch;
    _Atomic int32_t recent_kernel;
    int32_t priority;
    _Atomic uint64_t last_kernel_time;
    sem_t sem_postinit;
} region_v1;

#define ROW(fmt, table, type, member) \
    printf("%s %s %s %zu %zu\n", fmt, table, #member, offsetof(type, member), \
           sizeof(((type *)0)->member))

static void print_offsets(void) {
    ROW("v0", "region", region_v0, initialized_flag);
    ROW("v0", "region", region_v0, sm_init_flag);
    ROW("v0", "region", region_v0, owner_pid);
    ROW("v0", "region", region_v0, sem);
    ROW("v0", "region", region_v0, num);
    ROW("v0", "region", region_v0, uuids);
    ROW("v0", "region", region_v0, limit);
    ROW("v0", "region", region_v0, sm_limit);
    ROW("v0", "region", region_v0, procs);
    ROW("v0", "region", region_v0, proc_num);
    ROW("v0", "region", region_v0, utilization_switch);
    ROW("v0", "region", region_v0, recent_kernel);
    ROW("v0", "region", region_v0, priority);
    printf("v0 region sizeof 0 %zu\n", sizeof(region_v0));
    ROW("v0", "slot", slot_v0, pid);
    ROW("v0", "slot", slot_v0, hostpid);
    ROW("v0", "slot", slot_v0, used);
    ROW("v0", "slot", slot_v0, monitorused);
    ROW("v0", "slot", slot_v0, device_util);
    ROW("v0", "slot", slot_v0, status);
    printf("v0 slot sizeof 0 %zu\n", sizeof(slot_v0));
    ROW("v0", "used", mem_v0, context_size);
    ROW("v0", "used", mem_v0, module_size);
    ROW("v0", "used", mem_v0, data_size);
    ROW("v0", "used", mem_v0, offset);
    ROW("v0", "used", mem_v0, total);
    ROW("v0", "util", util_v0, dec_util);
    ROW("v0", "util", util_v0, enc_util);
    ROW("v0", "util", util_v0, sm_util);

    ROW("v1", "region", region_v1, initialized_flag);
    ROW("v1", "region", region_v1, major_version);
    ROW("v1", "region", region_v1, minor_version);
    ROW("v1", "region", region_v1, sm_init_flag);
    ROW("v1", "region", region_v1, owner_pid);
    ROW("v1", "region", region_v1, sem);
    ROW("v1", "region", region_v1, num);
    ROW("v1", "region", region_v1, uuids);
    ROW("v1", "region", region_v1, limit);
    ROW("v1", "region", region_v1, sm_limit);
    ROW("v1", "region", region_v1, procs);
    ROW("v1", "region", region_v1, proc_num);
    ROW("v1", "region", region_v1, utilization_switch);
    ROW("v1", "region", region_v1, recent_kernel);
    ROW("v1", "region", region_v1, priority);
    ROW("v1", "region", region_v1, last_kernel_time);
    ROW("v1", "region", region_v1, sem_postinit);
    printf("v1 region sizeof 0 %zu\n", sizeof(region_v1));
    ROW("v1", "slot", slot_v1, pid);
    ROW("v1", "slot", slot_v1, hostpid);
    ROW("v1", "slot", slot_v1, used);
    ROW("v1", "slot", slot_v1, monitorused);
    ROW("v1", "slot", slot_v1, device_util);
    ROW("v1", "slot", slot_v1, status);
    ROW("v1", "slot", slot_v1, seqlock);
    ROW("v1", "slot", slot_v1, unused);
    printf("v1 slot sizeof 0 %zu\n", sizeof(slot_v1));
    ROW("v1", "used", mem_v1, context_size);
    ROW("v1", "used", mem_v1, module_size);
    ROW("v1", "used", mem_v1, data_size);
    ROW("v1", "used", mem_v1, offset);
    ROW("v1", "used", mem_v1, total);
    ROW("v1", "util", util_v1, dec_util);
    ROW("v1", "util", util_v1, enc_util);
    ROW("v1", "util", util_v1, sm_util);
}

/* The fixture pattern (mirrored in tests/monitor/test_layout_c.py::pattern_spec). */
static int32_t slot_status(int s) { return s % 4 == 3 ? 0 : (s % 4 == 2 ? 2 : 1); }

static void fill_uuid(char *dst, int d) {
    if (d == 3) { /* not UTF-8: must be reported, not crash anything */
        dst[0] = (char)0xff;
        dst[1] = (char)0xfe;
        dst[2] = 'x';
        return;
    }
    snprintf(dst, 96, "GPU-fixture-%02d-0000-4000-8000-00000000%04d", d, d);
}

#define FILL_SLOT(slot, s)                                                      \
    do {                                                                        \
        (slot)->pid = 100 + (s);                                                \
        (slot)->hostpid = 1000 + (s);                                           \
        (slot)->status = slot_status(s);                                        \
        for (int d = 0; d < MAX_DEVICES; d++) {                                 \
            uint64_t base = (uint64_t)(s) * 1000 + (uint64_t)d * 10;            \
            (slot)->used[d].context_size = base + 1;                            \
            (slot)->used[d].module_size = base + 2;                             \
            (slot)->used[d].data_size = base + 3;                               \
            (slot)->used[d].offset = base + 4;                                  \
            (slot)->used[d].total = (uint64_t)(s) * 1000000 + (uint64_t)d * 1000 + 5; \
            (slot)->monitorused[d] = (uint64_t)(s + d);                         \
            (slot)->device_util[d].dec_util = (uint64_t)(s);                    \
            (slot)->device_util[d].enc_util = (uint64_t)d;                      \
            (slot)->device_util[d].sm_util = (uint64_t)((s * 7 + d) % 101);     \
        }                                                                       \
        if ((s) == 0) (slot)->used[0].total = UINT64_MAX - 2; /* sums wrap */   \
    } while (0)

#define FILL_HEAD(r, num)                                                       \
    do {                                                                        \
        (r)->initialized_flag = 19920718;                                       \
        (r)->sm_init_flag = 1;                                                  \
        (r)->owner_pid = 4242;                                                  \
        (r)->num = (num);                                                       \
        uint64_t devs = (num) < MAX_DEVICES ? (num) : MAX_DEVICES;              \
        for (uint64_t d = 0; d < devs; d++) {                                   \
            fill_uuid((r)->uuids[d], (int)d);                                   \
            (r)->limit[d] = (d + 1) << 30;                                      \
            (r)->sm_limit[d] = 5 * (d + 1);                                     \
        }                                                                       \
        (r)->utilization_switch = 1;                                            \
        (r)->recent_kernel = 2;                                                 \
        (r)->priority = 7;                                                      \
    } while (0)

#define SUMS(r, num, proc_num)                                                  \
    do {                                                                        \
        int live = (proc_num) < 0 ? 0 : ((proc_num) > MAX_SLOTS ? MAX_SLOTS : (proc_num)); \
        int active = 0;                                                         \
        for (int s = 0; s < live; s++) active += (r)->procs[s].status != 0;     \
        printf("active %d\n", active);                                          \
        uint64_t devs = (num) < MAX_DEVICES ? (num) : MAX_DEVICES;              \
        for (uint64_t d = 0; d < devs; d++) {                                   \
            uint64_t t = 0, c = 0, m = 0, b = 0, o = 0, sm = 0;                 \
            for (int s = 0; s < live; s++) {                                    \
                if ((r)->procs[s].status == 0) continue;                        \
                t += (r)->procs[s].used[d].total;                               \
                c += (r)->procs[s].used[d].context_size;                        \
                m += (r)->procs[s].used[d].module_size;                         \
                b += (r)->procs[s].used[d].data_size;                           \
                o += (r)->procs[s].used[d].offset;                              \
                sm += (r)->procs[s].device_util[d].sm_util;                     \
            }                                                                   \
            printf("sum %llu %llu %llu %llu %llu %llu %llu\n", (unsigned long long)d, \
                   (unsigned long long)t, (unsigned long long)c, (unsigned long long)m, \
                   (unsigned long long)b, (unsigned long long)o, (unsigned long long)sm); \
        }                                                                       \
    } while (0)

static int write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(data, 1, size, f);
    /* HAMi-core writes one NUL at offset sizeof: real files are sizeof + 1 bytes. */
    int nul_ok = fputc(0, f) == 0;
    return (fclose(f) == 0 && n == size && nul_ok) ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "offsets") == 0) {
        print_offsets();
        return 0;
    }
    if (argc != 7 || strcmp(argv[1], "write") != 0) {
        fprintf(stderr, "usage: %s offsets | write v0|v1 PATH NUM PROC_NUM NSLOTS\n", argv[0]);
        return 2;
    }
    const char *fmt = argv[2], *path = argv[3];
    uint64_t num = strtoull(argv[4], NULL, 10);
    int32_t proc_num = (int32_t)strtol(argv[5], NULL, 10);
    int nslots = atoi(argv[6]);
    if (nslots < 0 || nslots > MAX_SLOTS) return 2;
    if (strcmp(fmt, "v1") == 0) {
        region_v1 *r = calloc(1, sizeof *r);
        if (!r) return 1;
        FILL_HEAD(r, num);
        r->major_version = 1;
        r->minor_version = 2;
        r->last_kernel_time = 1700000000;
        for (int s = 0; s < nslots; s++) {
            FILL_SLOT(&r->procs[s], s);
            r->procs[s].seqlock = 2 * (uint64_t)s;
        }
        r->proc_num = proc_num;
        if (write_file(path, r, sizeof *r)) return 1;
        SUMS(r, num, proc_num);
        free(r);
        return 0;
    }
    if (strcmp(fmt, "v0") == 0) {
        region_v0 *r = calloc(1, sizeof *r);
        if (!r) return 1;
        FILL_HEAD(r, num);
        for (int s = 0; s < nslots; s++) FILL_SLOT(&r->procs[s], s);
        r->proc_num = proc_num;
        if (write_file(path, r, sizeof *r)) return 1;
        SUMS(r, num, proc_num);
        free(r);
        return 0;
    }
    return 2;
}
