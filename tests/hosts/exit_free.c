/* Frees device memory from a library destructor, after the interpreter has
 * finalized, the way libtorch's static destructors do at exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

static unsigned long long g_ptr;

void remember(unsigned long long p) { g_ptr = p; }

__attribute__((destructor)) static void free_at_exit(void) {
    int (*free_fn)(unsigned long long) = (int (*)(unsigned long long))dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    int rc = g_ptr && free_fn ? free_fn(g_ptr) : -1;
    fprintf(stderr, "exit_free rc=%d\n", rc);
}
