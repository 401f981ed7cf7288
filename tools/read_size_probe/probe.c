// Random-read throughput probe: O_DIRECT pread at 4096-aligned random offsets.
// Build: gcc -O2 -pthread -o probe probe.c
// Usage: ./probe FILE SECONDS REPS
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int fd;
static int use_direct = 1;
static const char *path;
static off_t fsize;
static volatile int stop_flag;

typedef struct {
  size_t sz;
  uint64_t seed;
  uint64_t nreads;
  uint64_t nbytes;
  uint64_t errs;
} targ_t;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t xs(uint64_t *s) {  // xorshift64*
  uint64_t x = *s;
  x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
  *s = x;
  return x * 2685821657736338717ULL;
}

static void *worker(void *p) {
  targ_t *a = p;
  void *buf;
  if (posix_memalign(&buf, 4096, a->sz)) { perror("posix_memalign"); exit(1); }
  memset(buf, 0, a->sz);
  uint64_t nblocks = (fsize - a->sz) / 4096 + 1;  // valid aligned start positions
  while (!stop_flag) {
    off_t off = (off_t)(xs(&a->seed) % nblocks) * 4096;
    ssize_t r = pread(fd, buf, a->sz, off);
    if (r < 0) { a->errs++; if (a->errs < 3) perror("pread"); continue; }
    a->nreads++;
    a->nbytes += (uint64_t)r;
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s FILE SECONDS REPS\n", argv[0]); return 1; }
  path = argv[1];
  double secs = atof(argv[2]);
  int reps = atoi(argv[3]);
  fd = open(path, O_RDONLY | O_DIRECT);
  if (fd < 0) {
    if (errno == EINVAL) {
      fprintf(stderr, "O_DIRECT open failed with EINVAL; falling back to buffered + fadvise(DONTNEED)\n");
      use_direct = 0;
      fd = open(path, O_RDONLY);
    }
    if (fd < 0) { perror("open"); return 1; }
  }
  struct stat st;
  fstat(fd, &st);
  fsize = st.st_size;
  fprintf(stderr, "opened %s size=%lld O_DIRECT=%d\n", path, (long long)fsize, use_direct);
  printf("# O_DIRECT=%d\n", use_direct);
  printf("rep,size_kib,threads,seconds,reads,bytes,MBps,reads_per_s,errs\n");

  const size_t sizes_kib[] = {4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  const int threads[] = {1, 4, 8};
  uint64_t seedbase = 0x9E3779B97F4A7C15ULL ^ (uint64_t)time(NULL);
  for (int rep = 0; rep < reps; rep++) {
    for (size_t si = 0; si < sizeof sizes_kib / sizeof *sizes_kib; si++) {
      for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        int nt = threads[ti];
        size_t sz = sizes_kib[si] * 1024;
        if (!use_direct) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        pthread_t th[16];
        targ_t a[16];
        stop_flag = 0;
        double t0 = now();
        for (int i = 0; i < nt; i++) {
          a[i] = (targ_t){.sz = sz, .seed = seedbase + 1000003ULL * (rep * 1000 + si * 10 + i) + 1};
          pthread_create(&th[i], NULL, worker, &a[i]);
        }
        struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
        nanosleep(&ts, NULL);
        stop_flag = 1;
        uint64_t nr = 0, nb = 0, ne = 0;
        for (int i = 0; i < nt; i++) {
          pthread_join(th[i], NULL);
          nr += a[i].nreads; nb += a[i].nbytes; ne += a[i].errs;
        }
        double el = now() - t0;  // includes tail of in-flight reads
        printf("%d,%zu,%d,%.3f,%llu,%llu,%.1f,%.1f,%llu\n", rep, sizes_kib[si], nt, el,
               (unsigned long long)nr, (unsigned long long)nb, nb / el / 1e6, nr / el,
               (unsigned long long)ne);
        fflush(stdout);
      }
    }
  }
  close(fd);
  return 0;
}
