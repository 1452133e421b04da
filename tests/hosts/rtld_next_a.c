/* Defines pv_probe and asks dlsym(RTLD_NEXT) for the next definition,
 * the way an interposing library does. */
#define _GNU_SOURCE
#include <dlfcn.h>
int pv_probe(void) { return 1; }
int next_probe(void) {
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "pv_probe");
    return f ? f() : -1;
}
