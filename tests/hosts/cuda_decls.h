/* Driver API declarations for the test hosts (no CUDA toolkit needed). */
#include <stdint.h>
#include <stddef.h>
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shm;
    CUstream s;
    void *attrs;
    unsigned nattrs;
} CUlaunchConfig;
typedef struct nvml_dev *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

#define CHECK(call)                                                                                              \
    do {                                                                                                         \
        int rc_ = (call);                                                                                        \
        if (rc_) {                                                                                               \
            printf("FAIL %s -> %d\n", #call, rc_);                                                              \
            return 1;                                                                                            \
        }                                                                                                        \
    } while (0)

static const char PTX[] = ".version 7.8\n.target sm_75\n.address_size 64\n.visible .entry pv_empty()\n{\n\tret;\n}\n";
