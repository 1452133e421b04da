/* Probe: which exported libcuda symbol does cuGetProcAddress return for
 * (name, cudaVersion, flags)? Prints one TSV line per query. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef int (*gpa2_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*gpa1_t)(const char *, void **, int, unsigned long long);
int main(int argc, char **argv) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
    int (*cuInit)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*drv)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int v = 0; drv(&v);
    printf("#driver\t%d\tinit\t%d\n", v, cuInit(0));
    gpa2_t gpa2 = (gpa2_t)dlsym(h, "cuGetProcAddress_v2");
    gpa1_t gpa1 = (gpa1_t)dlsym(h, "cuGetProcAddress");
    /* Every minor version from 2.0 to the driver's + 1; only changes of the
     * answer are printed, so each line starts a range of versions. */
    char name[256];
    while (fgets(name, sizeof name, stdin)) {
        name[strcspn(name, "\n")] = 0;
        if (!name[0])
            continue;
        void *exp = dlsym(h, name);
        printf("#export\t%s\t%s\n", name, exp ? "yes" : "no");
        for (unsigned long long fl = 0; fl < 3; fl++) {
            char last[512] = "";
            for (int ver = 2000; ver <= v + 10; ver += 10) {
                void *p = 0; int st = -1;
                int rc = gpa2(name, &p, ver, fl, &st);
                void *p1 = 0; int rc1 = gpa1(name, &p1, ver, fl);
                Dl_info di; const char *sym = "-";
                if (p && dladdr(p, &di) && di.dli_sname && di.dli_saddr == p) sym = di.dli_sname;
                else if (p) sym = "?internal";
                void *again = (p && sym[0] != '-' && sym[0] != '?') ? dlsym(h, sym) : 0;
                char line[512];
                snprintf(line, sizeof line, "%s\t%llu\t%d\t%d\t%s\t%s\t%d\t%s", name, fl, rc, st, sym,
                         again == p ? "eq" : "ne", rc1, p1 == p ? "same" : "diff");
                if (strcmp(line, last)) {
                    printf("%s\t%d\t%llu\t%d\t%d\t%s\t%s\t%d\t%s\n", name, ver, fl, rc, st, sym,
                           again == p ? "eq" : "ne", rc1, p1 == p ? "same" : "diff");
                    snprintf(last, sizeof last, "%s", line);
                }
            }
        }
    }
    return 0;
}
