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
    static const int vers[] = {2000, 3000, 3010, 3020, 4000, 6050, 7000, 9020, 10000, 11000, 11020, 11030,
                               11040, 11060, 11070, 11080, 12000, 12010, 12020, 12030, 12040, 12050, 12060,
                               12080, 12090, 13000, 13010, 99999};
    char name[256];
    while (fgets(name, sizeof name, stdin)) {
        name[strcspn(name, "\n")] = 0;
        if (!name[0]) continue;
        void *exp = dlsym(h, name);
        printf("#export\t%s\t%s\n", name, exp ? "yes" : "no");
        for (unsigned i = 0; i < sizeof vers / sizeof vers[0]; i++)
            for (unsigned long long fl = 0; fl < 3; fl++) {
                void *p = 0; int st = -1;
                int rc = gpa2(name, &p, vers[i], fl, &st);
                void *p1 = 0; int rc1 = gpa1(name, &p1, vers[i], fl);
                Dl_info di; const char *sym = "-";
                if (p && dladdr(p, &di) && di.dli_sname && di.dli_saddr == p) sym = di.dli_sname;
                else if (p) sym = "?internal";
                void *again = (p && sym[0] != '-' && sym[0] != '?') ? dlsym(h, sym) : 0;
                printf("%s\t%d\t%llu\t%d\t%d\t%s\t%s\t%d\t%s\n", name, vers[i], fl, rc, st, sym,
                       again == p ? "eq" : "ne", rc1, p1 == p ? "same" : "diff");
            }
    }
    return 0;
}
