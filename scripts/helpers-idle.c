// scripts/helpers-idle: a program that waits (20 epoll_waits of 200 us on a
// timerfd, dispatched under FASTWAKE_MODE=dispatch), then computes for SECS
// seconds, ROUNDS times, and prints every thread's context switches during
// each compute period (/proc/self/task/*/status). Usage: helpers-idle SECS ROUNDS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <stdint.h>
struct th { int tid; char name[32]; long vol, nvol; };
static int snap(struct th *t, int max) {
  DIR *d = opendir("/proc/self/task"); struct dirent *e; int n = 0;
  while ((e = readdir(d)) && n < max) {
    if (e->d_name[0] == '.') continue;
    char p[256], line[256]; snprintf(p, sizeof p, "/proc/self/task/%s/status", e->d_name);
    FILE *f = fopen(p, "r"); if (!f) continue;
    t[n].tid = atoi(e->d_name); t[n].vol = t[n].nvol = 0; t[n].name[0] = 0;
    while (fgets(line, sizeof line, f)) {
      if (!strncmp(line, "Name:", 5)) sscanf(line + 5, "%31s", t[n].name);
      else if (!strncmp(line, "voluntary_ctxt_switches:", 24)) t[n].vol = atol(line + 24);
      else if (!strncmp(line, "nonvoluntary_ctxt_switches:", 27)) t[n].nvol = atol(line + 27);
    }
    fclose(f); n++;
  }
  closedir(d); return n;
}
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec / 1e9; }
int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 10; int rounds = argc > 2 ? atoi(argv[2]) : 2;
  int ep = epoll_create1(0), tf = timerfd_create(CLOCK_MONOTONIC, 0);
  struct epoll_event ev = { .events = EPOLLIN, .data.fd = tf }; epoll_ctl(ep, EPOLL_CTL_ADD, tf, &ev);
  volatile uint64_t sink = 0;
  for (int r = 0; r < rounds; r++) {
    for (int w = 0; w < 20; w++) {   // a few waits, each ~200 us
      struct itimerspec its = { .it_value = { 0, 200000 } }; timerfd_settime(tf, 0, &its, 0);
      struct epoll_event out; int n = epoll_wait(ep, &out, 1, 1000);
      if (n != 1) { fprintf(stderr, "epoll_wait %d\n", n); return 1; }
      uint64_t x; read(tf, &x, 8);
    }
    struct th a[64], b[64]; int na = snap(a, 64);
    double t0 = now(); while (now() - t0 < secs) for (int i = 0; i < 1000; i++) sink += i * i;
    int nb = snap(b, 64);
    for (int i = 0; i < nb; i++) for (int j = 0; j < na; j++) if (a[j].tid == b[i].tid)
      printf("round %d %-14s vol +%ld nonvol +%ld\n", r, b[i].name, b[i].vol - a[j].vol, b[i].nvol - a[j].nvol);
    fflush(stdout);
  }
  return 0;
}
